"""Every site's ClientApp: fedstats' own (the site code of a deployment, unchanged)."""

from fedstats.flower_apps.site_app import app

__all__ = ["app"]
