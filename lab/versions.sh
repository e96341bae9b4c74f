# shellcheck shell=bash
# shellcheck disable=SC2034  # settings used by the scripts that source this file
# lab/versions.env with the Kubernetes release chosen for this run (sourced, not run):
# GPUK8S_KUBE_VERSION in the environment picks another of KUBE_VERSIONS than KUBE_VERSION,
# and KUBE_FEATURE_GATES / KUBE_RUNTIME_CONFIG are that release's lists. lab/versions.py
# resolves them (the one reader of versions.env); this evaluates its assignments.
_versions="$(python3 "$(dirname "${BASH_SOURCE[0]}")/versions.py" --shell)" || exit 2
eval "$_versions"
unset _versions
