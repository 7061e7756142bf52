"""What both halves of federated deep models share: the networks and the deep tasks' wire.

The registered architectures (:mod:`.models`), their losses (:mod:`.losses`), weights as
arrays (:mod:`.weights`), quantised updates (:mod:`.quantize`), and the wire of the
deep tasks (:mod:`.wire`, :mod:`.dp_sgd_plan`): the coordinator
(:mod:`fedstats.deep.training`) and the site (:mod:`fedstats.deep.site`) import
these, never each other.
"""
