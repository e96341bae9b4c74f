# shellcheck shell=bash
# shellcheck disable=SC2034  # settings used by the scripts that source this file
# lab/versions.env with the Kubernetes release chosen for this run (sourced, not run):
# GPUK8S_KUBE_VERSION in the environment (lab/up --kube), else the release the lab in
# $GPUK8S_LAB_STATE was brought up with, else KUBE_VERSION; KUBE_FEATURE_GATES /
# KUBE_RUNTIME_CONFIG are that release's lists. lab/versions.py resolves them (the one
# reader of versions.env); this evaluates its assignments. VERSIONS_FOR_LAB=1 (lab/lib.sh:
# the commands acting on the lab) refuses a GPUK8S_KUBE_VERSION other than the lab's;
# VERSIONS_FOR_TEARDOWN=1 (lab/down) accepts a recorded release versions.env no longer
# lists, with a warning.
_versions="$(python3 "$(dirname "${BASH_SOURCE[0]}")/versions.py" --shell \
    ${VERSIONS_FOR_LAB:+--lab} ${VERSIONS_FOR_TEARDOWN:+--teardown})" || exit 2
eval "$_versions"
unset _versions
