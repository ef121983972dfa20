"""The commands: ``list``/``info`` (discovery and its output formats), the CDI spec and the device
nodes a spec gets, and the ``nvc-py`` command line (:mod:`.cli`), whose ``configure`` runs the
pipeline (:mod:`nvc.pipeline`).

The layer above :mod:`nvc.pipeline`: the core below (nvc's basics, discover, plan, apply, share)
never imports it, nor ``nvc.rpc``, ``nvc.pipeline`` or ``nvc.hook``. May import anything below;
only the command line (:mod:`.cli`) and :mod:`nvc.hook` import it.
"""
