"""GPU sharing, what the host keeps of it: the record of whose sharing files they are (:mod:`.owner`)
and the readers of what the shim writes (:mod:`.region`, :mod:`.sched`) behind ``nvc-py share status``
(:mod:`.status`). A container's request is read by :mod:`nvc.containerenv.sharing`, its files planned
by :mod:`nvc.plan.share` and made by :mod:`nvc.apply.sharefiles`.

May import nvc's basics, planning and applying, nothing above.
"""
