# The upstream sources framefleet's adapters were written against: each one's repository and commit.
# Sourced by deploy/envs/build.sh (the model environments) and bench/gpu_lib.sh (the GPU benches' sources).
#
# UPSTREAM_GIT_BASE (default https://github.com): where the repositories are cloned from (a mirror, or a
# folder holding <owner>/<repo> clones).

UPSTREAM_GIT_BASE=${UPSTREAM_GIT_BASE:-https://github.com}

VIPE_REPO=hgupt3/vipe                  VIPE_COMMIT=1249a0cf2b147d1cf6e17cff019e9e0b2a51fb09
MOGE_REPO=microsoft/MoGe               MOGE_COMMIT=07444410f1e33f402353b99d6ccd26bd31e469e8      # ViPE's lyra pipeline
UTILS3D_REPO=EasternJournalist/utils3d UTILS3D_COMMIT=3fab839f0be9931dac7c8488eb0e1600c236e183   # MoGe's pin
PIPELINE_REPO=EasternJournalist/pipeline PIPELINE_COMMIT=866f059d2a05cde05e4a52211ec5051fd5f276d6 # MoGe's pin
TAPIP3D_REPO=zbw001/TAPIP3D            TAPIP3D_COMMIT=9359ae236f16a58a103dc1c55ad1919360dc6f8b
COTRACKER_REPO=facebookresearch/co-tracker COTRACKER_COMMIT=82e02e8029753ad4ef13cf06be7f4fc5facdda4d
WILOR_REPO=rolpotamias/WiLoR           WILOR_COMMIT=819369a764905a26a4e80aae04bbfa9c7e4f6512     # y2r's submodule commit
SAM2_REPO=facebookresearch/sam2        SAM2_COMMIT=2b90b9f5ceec907a1c18123530e92e794ad901a4
# y2r's submodule is 5eb25fb5, whose code is the same (their syntax trees differ only in one unused loop
# variable of the training data code; the rest is formatting).
SAM3_REPO=facebookresearch/sam3        SAM3_COMMIT=99d02f28c8d34610ab35559b72642b01f10fdb1e

PINNED=(VIPE MOGE UTILS3D PIPELINE TAPIP3D COTRACKER WILOR SAM2 SAM3)
# The model sources the GPU benches run, named <owner>+<repo> as their snapshot archives are.
UPSTREAM_SOURCES=(hgupt3+vipe microsoft+MoGe zbw001+TAPIP3D facebookresearch+co-tracker rolpotamias+WiLoR
  facebookresearch+sam2 facebookresearch+sam3)

pin() {  # NAME (<owner>+<repo>, or <owner>/<repo>) -> prints "URL COMMIT"; status 1 when NAME has no pin
  local p repo commit
  for p in "${PINNED[@]}"; do
    repo=${p}_REPO commit=${p}_COMMIT
    if [ "${!repo}" = "${1/+//}" ]; then
      echo "$UPSTREAM_GIT_BASE/${!repo} ${!commit}"
      return 0
    fi
  done
  return 1
}
