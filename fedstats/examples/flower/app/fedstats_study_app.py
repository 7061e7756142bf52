"""Entry points of the fedstats Flower App (the code lives in the installed fedstats package)."""

from fedstats.flower_apps.coordinator_app import app as serverapp
from fedstats.flower_apps.site_app import app as clientapp

__all__ = ["clientapp", "serverapp"]
