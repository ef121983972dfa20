"""``nvc-py-hook serve``: run hook (and CLI) calls in workers forked from one warm interpreter.

A Python hook started per container pays for the interpreter and its imports every time
(most of its cost: docs/performance.md), while the work itself takes a few tens of
milliseconds. The server imports everything the hook needs once; ``nvc-py-hook-client``
(native/client/hook_client.c), registered as the hook, passes each call to it: arguments,
environment, the three standard streams and the working directory (SCM_RIGHTS) over a
SOCK_SEQPACKET connection (the exchange: :mod:`.exchange`); a hook script may hand ``nvc-py configure``
over the same way. The server keeps one worker forked ahead (so no fork is on a call's path); the worker that takes a
call makes the server fork the next, takes the caller's streams and directory as its own, runs
:func:`nvc.hook.oci.prestart.main` (or :func:`nvc.commands.cli.main` for ``nvc-py``) exactly as the console
script would, and answers ``exit N``.
Before the first fork the server imports everything a call needs and plans once without a
container (a dry run), so a worker starts with warm caches. A spare left idle for
:data:`.worker.IDLE_BEFORE_HELPERS` readies its call's path: it forks an NVML helper and a container
helper (each confined as for a call, given nothing of one until it comes) and runs the dry plan
itself, which copies the pages a plan writes before the call is waiting for them.

What stays the same as a direct hook run: the configuration file is read per call, nothing
of one call survives into the next (each worker is a fresh fork of a process that never ran a
call), the privileged helpers serve one call each. What differs: the worker runs in the
server's namespaces and cgroup, so the server must run in the host's (a plain systemd service,
``KillMode=mixed``: a stopping server waits for its busy workers' calls before it exits, so a restart
lets running calls finish and leaves no process behind), and new code takes effect when
the server restarts: a worker that finds the installed code changed (:mod:`.upgrade`) answers
"fall back" and stops the server.

It runs the hook's stages and ``nvc-py configure``/``info``/``list`` (:mod:`.scope`);
anything else is answered "fall back" and runs in the caller. It is started by systemd's socket
unit or on demand by a hook client (:mod:`.activation`); an on-demand one exits when idle.
A wedged server costs the clients one hand-over timeout (:mod:`nvc.hook.server.wedge`): a starting server
removes the marker a client left for its predecessor; under systemd it feeds the watchdog from its
accept loop while its workers take calls (:mod:`.watchdog`), and is replaced when it stops;
without, a hook call that finds it wedged replaces it (native/client/server_start.c).

Only callers with the server's own uid (root) are served; the socket is 0600 in a directory of
the server's own with mode 0700 (the server refuses to start in any other, or through a
symlink, and never changes one it did not create), and the peer's credentials are checked again
on every connection. A root caller weaker than the server (fewer capabilities, under seccomp,
no_new_privs, another LSM label or a Landlock domain, chrooted) or in other mount, pid, user or
cgroup namespaces (a runtime inside a container) is told to fall back and runs the program
itself: :mod:`.peer` says why, and how the peer is pinned against pid reuse.

The package's modules, by concern: :mod:`.loop`, the server process (its start-up, the spares it
keeps forked, its idle exit and stop); :mod:`.worker`, a worker's life from spare to exit;
:mod:`.exchange`, one call's exchange with its caller and the call run; :mod:`.sockets`, the
listening socket and a connection's peer; :mod:`.peer`, whom a worker serves; :mod:`.upgrade`, the
installed code's stamp; :mod:`.scope`, :mod:`.activation` and :mod:`.watchdog` as above. The
client's side stays in :mod:`nvc.hook.server.handover` and :mod:`nvc.hook.server.wedge`: the hook program imports it
at every call, and nothing of the server.
"""
