"""Realistic log tails of failed training containers, written for these tests (not copied from anywhere)."""

NCCL_REMOTE_ERROR = """\
[rank5]:[I1104 03:12:44.118241 ProcessGroupNCCL.cpp:2059] [PG 0 Rank 5] ProcessGroupNCCL created ncclComm_ 0x55d1c3a0 on CUDA device: 5
trainer-worker-1:231:1187 [5] NCCL INFO Channel 00/0 : 5[5] -> 13[5] [send] via NET/IB/3/GDRDMA
trainer-worker-1:231:1187 [5] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.42.3.17<51820> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.42.1.9 remoteGids::ffff:10.42.3.17 hca mlx5_3
trainer-worker-1:231:1187 [5] NCCL INFO transport/net.cc:1298 -> 6
trainer-worker-1:231:1187 [5] NCCL INFO proxy.cc:698 -> 6
[rank5]: Traceback (most recent call last):
[rank5]:   File "/workspace/train.py", line 188, in <module>
[rank5]:     dist.all_reduce(grad_norm, op=dist.ReduceOp.SUM)
[rank5]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3124, remote process exited or there was a network error, NCCL version 2.21.5
[rank5]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
[rank5]: Last error:
[rank5]: NET/IB : Got completion from peer 10.42.3.17<51820> with status=12 opcode=0 len=0 vendor err 129 (Recv)
"""

NCCL_UNHANDLED_SYSTEM_ERROR = """\
Epoch 0:   3%|▎         | 118/4096 [02:31<1:25:01,  1.28s/it, loss=2.914]
llm-pretrain-master-0:88:412 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.244.7.31<47163> failed : Software caused connection abort
llm-pretrain-master-0:88:412 [0] NCCL INFO misc/socket.cc:565 -> 2
RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.
"""

CUDA_ILLEGAL_ADDRESS_THEN_NCCL = """\
step 20480 | loss 1.7321 | lr 2.87e-04 | grad_norm 0.912 | tokens/s 412881
Traceback (most recent call last):
  File "/opt/megatron/pretrain_gpt.py", line 243, in <module>
    pretrain(train_valid_test_datasets_provider, model_provider, ModelType.encoder_or_decoder, forward_step)
  File "/opt/megatron/megatron/training/training.py", line 1187, in train_step
    losses_reduced = forward_backward_func(
RuntimeError: CUDA error: an illegal memory access was encountered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.

[rank3]:[E1104 07:40:02.551902 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 3] Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered
terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG 0 Rank 3] Process group watchdog thread terminated with exception: NCCL error: unhandled cuda error
"""

DEVICE_SIDE_ASSERT = """\
/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:93: operator(): block: [412,0,0], thread: [64,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.
/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:93: operator(): block: [412,0,0], thread: [65,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.
Traceback (most recent call last):
  File "/app/finetune.py", line 97, in training_step
    logits = self.model(input_ids).logits
RuntimeError: CUDA error: device-side assert triggered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
"""

UNSPECIFIED_LAUNCH_FAILURE = """\
2026-03-02 11:03:17,004 INFO  trainer: checkpoint saved to /ckpt/step_30000
Traceback (most recent call last):
  File "/workspace/run.py", line 55, in <module>
    torch.cuda.synchronize()
RuntimeError: CUDA error: unspecified launch failure
"""

LAUNCH_TIMEOUT = """\
terminate called after throwing an instance of 'c10::Error'
  what():  CUDA error: the launch timed out and was terminated
Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:43 (most recent call first):
"""

CUDNN_BAD_PARAM = """\
  File "/usr/local/lib/python3.10/dist-packages/torch/nn/modules/conv.py", line 549, in _conv_forward
    return F.conv2d(
RuntimeError: cuDNN error: CUDNN_STATUS_BAD_PARAM
"""

CUDNN_EXECUTION_FAILED = """\
  File "/usr/local/lib/python3.10/dist-packages/torch/nn/modules/conv.py", line 549, in _conv_forward
    return F.conv2d(
RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED
"""

TORCH_ELASTIC_ONLY = """\
[2026-02-11 19:22:05,118] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) local_rank: 0 (pid: 311) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-02-11_19:22:05
  host      : bert-finetune-worker-0
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 311)
  error_file: <N/A>
============================================================
"""

TORCH_ELASTIC_WITH_VALUE_ERROR_AND_NCCL = """\
[rank1]: ValueError: expected sequence length 2048, got 4096
[rank0]:[W211 19:30:41.220 ProcessGroupNCCL.cpp:1168] Warning: WorkNCCL(SeqNum=88, OpType=ALLREDUCE) timed out
[rank0]:[E211 19:30:41.221 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""

ECC_UNCORRECTABLE = """\
RuntimeError: CUDA error: uncorrectable ECC error encountered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
[rank2]:[E1104 09:01:55.004 ProcessGroupNCCL.cpp:1595] NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)
"""

XID_FROM_HOST_LOG = """\
health-probe: dmesg tail on node gpu-a100-14
[Tue Mar  3 04:11:52 2026] NVRM: Xid (PCI:0000:b7:00): 79, pid=0, name=python3, GPU has fallen off the bus.
[Tue Mar  3 04:11:52 2026] NVRM: GPU 0000:b7:00.0: GPU has fallen off the bus.
"""

CLEAN_OOM_NOISE = """\
Epoch 3:  41%|████      | 1680/4096 [31:02<44:38,  1.11s/it, loss=1.203]
Killed
"""

PYTHON_ERROR_ONLY = """\
Traceback (most recent call last):
  File "/app/main.py", line 12, in <module>
    import transformers
ModuleNotFoundError: No module named 'transformers'
"""
