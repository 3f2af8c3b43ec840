# Sourced by the GPU scripts (gpu_check.sh, gpu_speed.sh, gpu_experiment.sh), from dev/ or from
# build/gpu/, where dev/gpu_bundle.sh copies this file beside check.sh: goes to the repository root
# and sets g (the bundle's folder), py (python3, or PYTHON) and the path to the bundle's libraries.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
while [ ! -e "$root/train_gpt.cu" ] && [ "$root" != / ]; do root=$(dirname "$root"); done
cd "$root" || exit 1
g=build/gpu
py=${PYTHON:-python3}
export LD_LIBRARY_PATH="$g/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The library folders of PyTorch's CUDA wheels (cuDNN, NVRTC, ...), for the programs that load
# cuDNN at run time (./train, test_gpt_cuda, dev_cudnn_attention and the candidate builds): a command
# prefixed with "${with_cudnn[@]}" runs with them after the rest of the path. Only those: a folder
# on LD_LIBRARY_PATH comes before the system's own libraries (ld.so.cache), so a wheel's cuBLAS
# would replace the machine's for every program.
wheel_libs=$("$py" -c 'import glob, site; print(":".join(sorted(glob.glob(site.getsitepackages()[0] + "/nvidia/*/lib"))))' 2>/dev/null)
with_cudnn=(env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH${wheel_libs:+:$wheel_libs}")
