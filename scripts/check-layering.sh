#!/usr/bin/env bash
# Layering check: a layer includes only itself and the layers it links against.
# The allowed graph is the one the CMakeLists.txt files declare (DEPENDS of each
# seqpar_add_layer, transitively):
#
#   core      -> (nothing)
#   autograd  -> core
#   nn        -> autograd, core
#   optim     -> autograd, core            (nn and optim do not see each other)
#   dist      -> core                      (no autograd, nn or optim)
#   apps/     -> anything (not checked here)
#
# and, outside the product, the benchmarks' fused step (bench/fused/, seqpar::fused):
#   bench/fused -> nn, optim, autograd, dist, core   (not the bench programs in bench/src/;
#                  dist only in nccl_enqueued.*, a library of its own: seqpar::fused_nccl)
#
# Every source under core/ autograd/ nn/ optim/ dist/ bench/fused/ is scanned for
# `#include "LAYER/..."` (or <LAYER/...>) of a layer it may not use (bench/fused counts
# as its own layer, the rest of bench/ as another). Prints each offending file:line and
# include, and exits 1 if there is any.
#
#   bash scripts/check-layering.sh        (from anywhere; checks this checkout)
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A allowed=(
  [core]="core"
  [autograd]="autograd core"
  [nn]="nn autograd core"
  [optim]="optim autograd core"
  [dist]="dist core"
  [bench/fused]="bench/fused nn optim autograd dist core"
)
layers="core autograd nn optim dist apps tests bench bench/fused"

failures=0
for layer in core autograd nn optim dist bench/fused; do
  while IFS= read -r -d '' file; do
    # line:include-target for every include of a project path "layer/..." or <layer/...>
    while IFS=: read -r line target; do
      [ -n "$target" ] || continue
      included_layer=${target%%/*}
      case "$target" in bench/fused/*) included_layer=bench/fused ;; esac
      case " $layers " in *" $included_layer "*) ;; *) continue ;; esac  # not ours (e.g. <cuda/...>)
      case " ${allowed[$layer]} " in
        *" $included_layer "*) ;;
        *)
          echo "layering: $file:$line includes \"$target\": $layer/ may include only" \
               "${allowed[$layer]// /, } (see scripts/check-layering.sh)" >&2
          failures=$((failures + 1))
          ;;
      esac
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<][a-z_]+/' "$file" \
               | sed -E 's/^([0-9]+):[^"<]*["<]([^">]+)[">].*/\1:\2/' || true)
  done < <(find "$layer" -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.cpp' \
                                   -o -name '*.cu' -o -name '*.cuh' \) -print0)
done

if [ "$failures" -ne 0 ]; then
  echo "layering: $failures include(s) of a higher or sibling layer; see the table at the top of scripts/check-layering.sh" >&2
  exit 1
fi
echo "layering: ok (core < autograd < nn, optim < bench/fused; core < dist < bench/fused)"
