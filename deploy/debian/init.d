#!/bin/sh
### BEGIN INIT INFO
# Provides:          nvc-py-hook
# Required-Start:    $local_fs $remote_fs
# Required-Stop:     $local_fs $remote_fs
# Default-Start:     2 3 4 5
# Default-Stop:      0 1 6
# Short-Description: nvc-py's hook server, where systemd does not run it
# Description:       The hook server that nvc-py's OCI hooks and nvc-py-runtime hand their
#                    calls to, started at boot as `nvc-py setup` starts it: detached, no
#                    idle exit. Where systemd runs, the package's nvc-py-hook.socket does it.
### END INIT INFO
# /etc/init.d/nvc-py-hook: installed by the nvc-py package (postinst registers it with update-rc.d).
# Without it a host whose init is not systemd is served only after `nvc-py setup`, until it restarts:
# its hooks start a server on demand, which stops when idle. /etc/nvc-py/no-server (`nvc-py setup
# --no-server`) keeps it from starting one.

PATH=/usr/sbin:/usr/bin:/sbin:/bin
FRONT=/usr/lib/nvc-py/nvc-py-hook
PYTHON=/usr/lib/nvc-py/venv/bin/python
SOCKET=/run/nvc-py/hook.sock
NO_SERVER=/etc/nvc-py/no-server

[ -x $FRONT ] || exit 0 # removed, not purged

# Where systemd runs, this hands the command to systemctl (nvc-py-hook.service) and exits.
. /lib/lsb/init-functions

servers() {
	$PYTHON -I -m nvc.hook.setup.maintainer "$1" --socket $SOCKET
}

case "$1" in
start)
	if [ -e $NO_SERVER ]; then
		echo "nvc-py-hook: no hook server started: $NO_SERVER (nvc-py setup --no-server)"
		exit 0
	fi
	exec $FRONT start-server
	;;
stop)
	servers stop-servers
	;;
restart | force-reload)
	servers stop-servers || exit 1
	exec "$0" start
	;;
status)
	servers server-status
	;;
*)
	echo "Usage: /etc/init.d/nvc-py-hook {start|stop|restart|force-reload|status}" >&2
	exit 3
	;;
esac
