"""Built-in tasks (:class:`dipsjax.task.Task`): the LLaMA language model on a text corpus
(:mod:`dipsjax.tasks.lm`, the default)."""
