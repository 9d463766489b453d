#!/usr/bin/env bash
# Prints the path of a helm binary of the pinned version, building it from the Go module proxy
# the first time. Built once per machine, outside the checkout, so clean clones reuse it.
# The -X flags are those of helm's own release build (its Makefile): without them `helm version`
# says "v3.22" and helm assumes Kubernetes 1.20 for .Capabilities.KubeVersion and the chart's
# kubeVersion check; with them it assumes the version of the client-go it is built with (1.37).
set -euo pipefail
HELM_VERSION=v3.22.0
K8S_MAJOR=1   # client-go v0.37.0, as helm v3.22.0's go.mod pins it
K8S_MINOR=37
dir="${JOBBROKER_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jobbroker-tools}/helm-$HELM_VERSION"
if [ ! -x "$dir/helm" ]; then
  echo "install-helm: building helm $HELM_VERSION (once per machine, takes a few minutes)" >&2
  mkdir -p "$dir"
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  ldflags+=" -X helm.sh/helm/v3/internal/version.metadata="
  for pkg in lint/rules chartutil; do
    ldflags+=" -X helm.sh/helm/v3/pkg/$pkg.k8sVersionMajor=$K8S_MAJOR"
    ldflags+=" -X helm.sh/helm/v3/pkg/$pkg.k8sVersionMinor=$K8S_MINOR"
  done
  GOBIN="$dir" GOFLAGS=-mod=mod CGO_ENABLED=0 go install -ldflags "$ldflags" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
fi
echo "$dir/helm"
