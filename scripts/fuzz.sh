#!/usr/bin/env bash
# Runs every Go fuzz target of the module, each for FUZZ_TIME (default 1m).
#
#   scripts/fuzz.sh                 # every package (./...)
#   FUZZ_TIME=10s scripts/fuzz.sh ./bus/... ./transports/...
#
# The targets are discovered, not listed here: `go test -list '^Fuzz'` names
# the Fuzz* functions of each package, so a target added anywhere is picked
# up. Every target runs even when an earlier one fails; the script fails if
# any did, or if no target was found. A failing input is saved by go test
# under the package's testdata/fuzz/, where plain `go test` replays it.
set -euo pipefail

GO="${GO:-go}"
FUZZ_TIME="${FUZZ_TIME:-1m}"
if [ "$#" -eq 0 ]; then
	set -- ./...
fi

# `go test -list` prints the matching names of a package, then
# "ok <package> …" (or "?  <package> [no test files]").
if ! listing=$("$GO" test -run '^$' -list '^Fuzz' "$@" 2>&1); then
	echo "$listing" >&2
	echo "fuzz: listing the fuzz targets failed" >&2
	exit 1
fi

targets=()
pending=()
while IFS= read -r line; do
	case "$line" in
	Fuzz*)
		pending+=("$line")
		;;
	ok[[:space:]]*)
		pkg=$(awk '{print $2}' <<<"$line")
		for name in "${pending[@]+"${pending[@]}"}"; do
			targets+=("$pkg $name")
		done
		pending=()
		;;
	esac
done <<<"$listing"

if [ "${#targets[@]}" -eq 0 ]; then
	echo "fuzz: no fuzz targets found in $*" >&2
	exit 1
fi

echo "fuzz: ${#targets[@]} targets, $FUZZ_TIME each"
failed=()
for target in "${targets[@]}"; do
	pkg=${target% *}
	name=${target#* }
	echo "=== $name ($pkg)"
	if ! "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZ_TIME" "$pkg"; then
		failed+=("$name ($pkg)")
	fi
done

if [ "${#failed[@]}" -gt 0 ]; then
	echo "fuzz: ${#failed[@]} of ${#targets[@]} targets failed:" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "fuzz: all ${#targets[@]} targets passed"
