#!/usr/bin/env bash
# ncu on one conv layer: ours (the implicit GEMM) and PyTorch's cuDNN kernel for the same layer
# (fp16 channels-last 32x64x56x56 by 64 3x3 filters unless W names another bench workload).
set -u
export FERRODNN_CACHE_DIR=/tmp/ferrodnn-kernel-cache
mkdir -p $FERRODNN_CACHE_DIR; tar -xzf .gpu/kcache.tar.gz -C $FERRODNN_CACHE_DIR
W=${W:-conv_fprop_fp16_nhwc_32x64x56x56_k64_3x3s1}
SET=${NCU_SET:---section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy}
timeout 200 ncu $SET -k regex:gemm -c 1 .gpu/ferrodnn bench --suite conv --filter "$W" --runs 2 > $OUT/ncu_ours.txt 2>&1
grep -E "Duration|Throughput|Warp Cycles|Registers|Grid Size|Block Size|L2 Hit|Mem Busy|Max Bandwidth|Issued Ipc|Pipe|Bank" $OUT/ncu_ours.txt | head -60
[ "${NCU_CUDNN:-1}" = 1 ] || exit 0
cat > /tmp/tc.py <<'PY'
import torch
torch.backends.cudnn.benchmark=True
x=torch.randn(32,64,56,56,device="cuda",dtype=torch.float16).to(memory_format=torch.channels_last)
w=torch.randn(64,64,3,3,device="cuda",dtype=torch.float16).to(memory_format=torch.channels_last)
for _ in range(5): y=torch.nn.functional.conv2d(x,w,padding=1)
torch.cuda.synchronize()
y=torch.nn.functional.conv2d(x,w,padding=1)
torch.cuda.synchronize()
PY
timeout 200 ncu $SET -k regex:xmma -c 1 --launch-skip 3 python3 /tmp/tc.py > $OUT/ncu_cudnn.txt 2>&1
grep -E "^  [a-z_0-9]+.*\(|Duration|Throughput|Warp Cycles|Registers|Grid Size|Block Size|L2 Hit|Mem Busy|Max Bandwidth|Issued Ipc|Pipe|Bank" $OUT/ncu_cudnn.txt | head -60
