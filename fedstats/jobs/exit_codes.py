"""Exit codes of the scheduled jobs, for cron, systemd and Airflow (kept light for the CLI)."""

from __future__ import annotations

from enum import IntEnum


class SiteExit(IntEnum):
    """Exit codes of ``fedstats site run`` (:mod:`fedstats.jobs.site_batch`)."""

    OK = 0
    CONFIGURATION = 2
    HARMONISATION = 3
    BUDGET_EXHAUSTED = 4
    COORDINATOR_UNREACHABLE = 5
    DISCLOSURE_REFUSED = 6
    ALREADY_RUNNING = 7
    SERVE_FAILED = 8
    LEDGER_INTEGRITY = 11


SITE_EXIT_HELP = (
    "Exit codes: 0 success (also 'nothing new'); 2 configuration error; 3 harmonisation "
    "failure; 4 budget exhausted; 5 coordinator unreachable; 6 refused by disclosure control; "
    "7 already running; 8 the site's Flower processes failed or the job was stopped; "
    "11 the privacy ledger does not verify or does not extend the chain head a run "
    "recorded (nothing was served)."
)


class StudyExit(IntEnum):
    """Exit codes of ``fedstats study run`` (:mod:`fedstats.jobs.study_run`)."""

    OK = 0
    CONFIGURATION = 2
    SUPERLINK_UNREACHABLE = 5
    SITE_LOST = 9
    RUN_FAILED = 10


STUDY_EXIT_HELP = (
    "Exit codes: 0 success; 2 configuration error; 5 SuperLink unreachable or submission "
    "refused; 9 a site was lost or never answered (named); 10 the run failed (fit error, "
    "incompatible sites, run_timeout, report)."
)
