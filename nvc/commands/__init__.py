"""The commands that drive the pipeline: ``configure`` (request → discovery → plan → apply, through
the privileged helpers of :mod:`nvc.rpc`), ``list``/``info`` (discovery and its output formats),
the CDI spec and the device nodes a spec gets, and the ``nvc-py`` command line (:mod:`.cli`).

The layer above :mod:`nvc.rpc`: the core below (nvc's basics, discover, plan, apply, share) never
imports it, nor ``nvc.rpc`` or ``nvc.hook``. May import anything below; only the command line
(:mod:`.cli`) and :mod:`nvc.hook` import it.
"""
