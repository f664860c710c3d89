"""Ablation: the Di-PS anomaly penalty as the paper states it vs our defaults.

A synthetic stream of rounds: 4 learners a round whose squared pseudo-gradient norms follow a
slowly decaying lognormal (as in training), with one learner's norm blown up 100x (a 10x
larger pseudo-gradient) every 7th round from round 3 on. Both rules see the same stream through the
leader's NumPy decision step (:mod:`dipsjax.rules`). Reports the share of outliers rejected
and of normal learners wrongly rejected, over the whole run and over the first 50 rounds.

Ours: warm-up 3 (first norms averaged with step max(alpha, 1/n), nothing judged before 3
accepted norms), max(recent E) floored at 1 (a sigma floor is an option, off). Paper: neither
(mu and sigma start at 0, so the first round scores +inf, and that score sits in the
recent-score stack -- and the threshold at +inf -- until the stack (32 scores) cycles).

Run: ``.venv/bin/python benchmarks/anomaly_ablation.py``.
"""

from __future__ import annotations

import numpy as np

from dipsjax import rules

STREAMS = {
    # name: (decay time constant in rounds, lognormal spread of the norms)
    "slow_decay": (150.0, 0.2),
    "fast_decay": (20.0, 0.2),
    "steady_tight": (1e9, 0.01),
}


def run(
    cfg: rules.AnomalyConfig, stream: str = "slow_decay", rounds: int = 400, seed: int = 0
) -> dict[str, float]:
    tau, spread = STREAMS[stream]
    rng = np.random.default_rng(seed)
    state = rules.init_history(np, cfg.history)
    caught = missed = false = normal = 0
    early_caught = early_out = 0
    for r in range(rounds):
        scale = 50.0 * np.exp(-r / tau) + 5.0
        g = scale * rng.lognormal(0.0, spread, size=4).astype(np.float32)
        outlier = r % 7 == 3
        if outlier:
            g[r % 4] *= 100.0
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            dec = rules.score(
                np,
                state,
                g,
                np.ones(4, bool),
                beta=cfg.beta,
                warmup=cfg.warmup,
                min_max_score=cfg.min_max_score,
                min_sigma_ratio=cfg.min_sigma_ratio,
            )
            state = rules.fold(
                np, state, g, dec.scores, dec.accepted, alpha=cfg.alpha, warmup=cfg.warmup
            )
        for j in range(4):
            bad = outlier and j == r % 4
            if bad:
                caught += not dec.accepted[j]
                missed += bool(dec.accepted[j])
                if r < 50:
                    early_out += 1
                    early_caught += not dec.accepted[j]
            else:
                normal += 1
                false += not dec.accepted[j]
    return {
        "outliers_rejected": caught / (caught + missed),
        "normal_rejected": false / normal,
        "outliers_rejected_first_50_rounds": early_caught / early_out,
    }


def main() -> None:
    variants = {
        "ours": rules.AnomalyConfig(warmup=3),
        "ours+sigma_floor": rules.AnomalyConfig(warmup=3, min_sigma_ratio=0.05),
        "paper": rules.AnomalyConfig.paper(),
        "paper+warmup": rules.AnomalyConfig(warmup=3, min_max_score=None, min_sigma_ratio=0.0),
        "ours-max_floor": rules.AnomalyConfig(warmup=3, min_max_score=None),
    }
    results = {}
    for stream in STREAMS:
        for name, cfg in variants.items():
            res = results[stream, name] = run(cfg, stream)
            print(
                f"{stream:13s} {name:17s} outliers rejected {res['outliers_rejected']:.3f} "
                f"(first 50 rounds {res['outliers_rejected_first_50_rounds']:.3f}), "
                f"normal rejected {res['normal_rejected']:.3f}"
            )
    for name in ("ours", "paper"):
        caught = min(results[s, name]["outliers_rejected"] for s in STREAMS)
        false = max(results[s, name]["normal_rejected"] for s in STREAMS)
        print(f"anomaly_outliers_rejected_{name}: {caught:.3f} (worst stream; goal: 1.0)")
        print(f"anomaly_false_rejections_{name}: {false:.3f} (worst stream; goal: 0)")


if __name__ == "__main__":
    main()
