"""The coordinator's side: the federation, design agreement, the models and their results."""
