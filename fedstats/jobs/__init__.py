"""Operations: a site's batch job and service, the coordinator's study run and its recording."""
