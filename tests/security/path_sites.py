"""Sites and frames the verified-path attack tests share: Poisson counts whose first Newton
step is halved, Rossi's prisoners dealt to two sites, and served site folders that sign with
the study's roster."""

from __future__ import annotations

import numpy as np
import pandas as pd
from lifelines.datasets import load_rossi


def poisson_counts() -> dict[str, pd.DataFrame]:
    """Counts of mean about 30 at three sites: a Newton step from 0 overshoots the intercept
    (``exp(30)`` times too large), so its log-likelihood falls and the step must be halved."""
    rng = np.random.default_rng(7)
    frames = {}
    for s in ("a", "b", "c"):
        x = rng.normal(0, 1, 300)
        frames[s] = pd.DataFrame({"x": x, "y": rng.poisson(np.exp(3.4 + 0.1 * x))})
    return frames


def rossi_sites() -> dict[str, pd.DataFrame]:
    """Rossi's prisoners dealt alternately to two sites (as the Cox parity tests deal them)."""
    frame = load_rossi()
    return {f"s{i}": frame.iloc[i::2].reset_index(drop=True) for i in range(2)}


def served_sites(frames, folder) -> dict:
    """A site.toml per hospital, each verifying paths with the study's roster of both keys."""
    import tomli_w
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from fedstats.secagg.roster import write_roster

    keys = {site: ed25519.Ed25519PrivateKey.generate() for site in frames}
    public = {
        site: key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
        for site, key in keys.items()
    }
    roster = write_roster(folder / "roster.toml", "audit-study", public)
    paths = {}
    for site, frame in frames.items():
        home = folder / site
        home.mkdir(parents=True)
        frame.to_parquet(home / "frame.parquet")
        (home / "signing.key").write_bytes(
            keys[site].private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())
        )  # fmt: skip
        config = {
            "site": {"name": site, "workdir": str(home / "work")},
            "data": {"frame": str(home / "frame.parquet")},
            "privacy": {"ledger": str(home / "site.ledger")},
            "disclosure": {"verified_paths": True},
            "secure_aggregation": {"roster": str(roster), "signing_key": str(home / "signing.key")},
        }
        paths[site] = home / "site.toml"
        paths[site].write_text(tomli_w.dumps(config), encoding="utf-8")
    return paths
