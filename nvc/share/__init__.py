"""GPU sharing's shared files, as the host reads them: the layouts of what the shim writes, its
region (:mod:`.region`) and its scheduler file (:mod:`.sched`), read by ``nvc-py share status``
(:mod:`nvc.commands.sharestatus`) and sized by :mod:`nvc.apply.sharefiles`. A container's request is
read by :mod:`nvc.plan.fromenv`, its files planned by :mod:`nvc.plan.share`, made by
:mod:`nvc.apply.sharefiles` with their owner's record (:mod:`nvc.apply.shareowner`).

Pure: imports nothing of nvc.
"""
