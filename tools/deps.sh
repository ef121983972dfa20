#!/bin/sh
# The long steps of `make deps`, `make demo` and `make install`, one line each: apt's and pip's own
# output goes to a log under $LOGDIR, shown (its last lines) only when the step fails.
#
#   tools/deps.sh step NAME WHAT COMMAND...   run COMMAND, its output in $LOGDIR/NAME.log; print WHAT and
#                                             how long it took, or the log's tail and COMMAND's status
#   tools/deps.sh apt-plan                    say what apt-get will install and upgrade (lists updated first)
#   tools/deps.sh apt-install                 install what is missing, and apt's summary line
#
# The apt side reads $APT_PACKAGES (needed) and $APT_OPTIONAL (installed where the distribution has
# them). POSIX sh: on a fresh machine it runs before Python is installed.
set -u
LOGDIR=${LOGDIR:-.make}

step() {
	name=$1 what=$2
	shift 2
	mkdir -p "$LOGDIR"
	log=$LOGDIR/$name.log
	printf '%s ... ' "$what"
	started=$(date +%s)
	if "$@" > "$log" 2>&1; then
		echo "done ($(($(date +%s) - started)) s)"
		return 0
	else
		status=$?
	fi
	echo "FAILED (status $status); the last lines of $log:"
	tail -n 30 "$log" | sed 's/^/    /'
	return $status
}

installed() {
	dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed'
}

# The needed packages that are not installed.
needed() {
	for p in $APT_PACKAGES; do installed "$p" || echo "$p"; done
}

# The optional packages not installed that the package lists have.
optional() {
	for p in $APT_OPTIONAL; do
		installed "$p" || ! apt-cache show "$p" 2>/dev/null | grep -q '^Version:' || echo "$p"
	done
}

# Everything to install, the package lists updated first where a needed package is missing (not
# again within 10 minutes: make demo's plan has just done it).
missing() {
	needed=$(needed)
	if [ -n "$needed" ] && [ -z "$(find "$LOGDIR/apt-updated" -mmin -10 2>/dev/null)" ]; then
		step apt-update "apt: updating the package lists" apt-get update >&2 || return 1
		touch "$LOGDIR/apt-updated"
	fi
	echo $needed $(optional)
}

case "${1:-}" in
step)
	shift
	step "$@"
	;;
apt-plan)
	packages=$(missing) || exit 1
	if [ -z "$packages" ]; then
		echo "  apt: nothing to install (every package is there)"
		exit 0
	fi
	plan=$(apt-get install -s --no-install-recommends $packages) || exit 1
	new=$(echo "$plan" | awk '/^Inst / && $3 !~ /^\[/ { print $2 }')
	upgraded=$(echo "$plan" | awk '/^Inst / && $3 ~ /^\[/ { print $2 }')
	echo "  apt: installs $(echo $packages | wc -w) packages, $(echo $new | wc -w) with what they need: $packages"
	if [ -n "$upgraded" ]; then
		echo "  apt: upgrades $(echo $upgraded | wc -w) installed packages they need: $(echo $upgraded)"
	fi
	;;
apt-install)
	packages=$(missing) || exit 1
	if [ -z "$packages" ]; then
		exit 0
	fi
	step apt-install "apt: installing $(echo $packages | wc -w) packages" \
		env DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Dpkg::Use-Pty=0 --no-install-recommends \
		$packages || exit 1
	echo "apt: $(grep -E '^[0-9]+ upgraded, [0-9]+ newly installed' "$LOGDIR/apt-install.log") (log: $LOGDIR/apt-install.log)"
	;;
*)
	echo "usage: tools/deps.sh step NAME WHAT COMMAND... | apt-plan | apt-install" >&2
	exit 2
	;;
esac
