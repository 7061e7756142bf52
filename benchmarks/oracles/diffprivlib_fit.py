"""Fit diffprivlib's LogisticRegression (centralised epsilon-DP) in the oracle environment.

Usage: python diffprivlib_fit.py IN.npz OUT.json
IN holds X (rows already scaled by public bounds), y, data_norm, epsilons, repeats.
OUT: {"fits": [{"epsilon": e, "coef": [...], "intercept": b}, ...]}
"""

import json
import sys

import numpy as np
from diffprivlib.models import LogisticRegression


def main() -> None:
    data = np.load(sys.argv[1])
    X, y = data["X"], data["y"]
    fits = []
    for epsilon in data["epsilons"]:
        for _ in range(int(data["repeats"])):
            model = LogisticRegression(
                epsilon=float(epsilon), data_norm=float(data["data_norm"]), max_iter=1000
            )
            model.fit(X, y)
            fits.append(
                {
                    "epsilon": float(epsilon),
                    "coef": model.coef_.ravel().tolist(),
                    "intercept": float(model.intercept_[0]),
                }
            )
    with open(sys.argv[2], "w") as handle:
        json.dump({"fits": fits}, handle)


if __name__ == "__main__":
    main()
