"""Multi-machine studies on Flower: carrying the same task messages between machines.

A message's record holds the codec's bytes unchanged (:mod:`fedstats.flower.messages`);
a site's identity is its node key, bound to its name by the study's enrolment list
(:mod:`fedstats.flower.enrolment`, :mod:`fedstats.flower.site_claims`, made by
:mod:`fedstats.flower.study_pki`); the Flower processes are started and stopped by
:mod:`fedstats.flower.processes` (:mod:`fedstats.flower.supernode`,
:mod:`fedstats.flower.local_study` for a study on one machine). Nothing here knows a
study's jobs: the apps that run them over Flower are in :mod:`fedstats.flower_apps`.
"""
