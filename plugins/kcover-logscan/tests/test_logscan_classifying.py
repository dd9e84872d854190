from __future__ import annotations

import logscan_tails as logtails
import pydantic
import pytest
from kcover_logscan import classifying

HW = classifying.FailureClass.HARDWARE_SUSPECT
APP = classifying.FailureClass.APPLICATION
COMM = classifying.FailureClass.COMMUNICATION


@pytest.mark.parametrize(("tail", "failure_class", "pattern", "first_line"), [
    (logtails.NCCL_REMOTE_ERROR, COMM, "nccl-warn",
     "trainer-worker-1:231:1187 [5] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer"),
    (logtails.NCCL_UNHANDLED_SYSTEM_ERROR, COMM, "nccl-warn", "llm-pretrain-master-0:88:412 [0] misc/socket.cc:484 NCCL WARN"),
    # The illegal access on this rank is the cause; the NCCL errors that follow are its echo.
    (logtails.CUDA_ILLEGAL_ADDRESS_THEN_NCCL, HW, "cuda-illegal-memory-access",
     "RuntimeError: CUDA error: an illegal memory access was encountered"),
    (logtails.DEVICE_SIDE_ASSERT, APP, "cuda-device-side-assert", "RuntimeError: CUDA error: device-side assert triggered"),
    (logtails.UNSPECIFIED_LAUNCH_FAILURE, HW, "cuda-unspecified-launch-failure", "RuntimeError: CUDA error: unspecified launch failure"),
    (logtails.LAUNCH_TIMEOUT, HW, "cuda-launch-timeout", "what():  CUDA error: the launch timed out and was terminated"),
    (logtails.CUDNN_BAD_PARAM, APP, "cudnn-status", "RuntimeError: cuDNN error: CUDNN_STATUS_BAD_PARAM"),
    (logtails.CUDNN_EXECUTION_FAILED, HW, "cudnn-execution-failed", "RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"),
    (logtails.TORCH_ELASTIC_ONLY, APP, "torch-elastic-child-failed", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"),
    # Elastic's wrapper never outranks a specific signal.
    (logtails.TORCH_ELASTIC_WITH_VALUE_ERROR_AND_NCCL, COMM, "nccl-watchdog-timeout",
     "[rank0]:[E211 19:30:41.221 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout"),
    (logtails.ECC_UNCORRECTABLE, HW, "ecc-error", "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
    (logtails.XID_FROM_HOST_LOG, HW, "xid", "[Tue Mar  3 04:11:52 2026] NVRM: Xid (PCI:0000:b7:00): 79"),
])
def test_default_table_classifies_realistic_tails(tail: str, failure_class: classifying.FailureClass, pattern: str,
                                                  first_line: str) -> None:
    found = classifying.classify(tail)
    assert found is not None
    assert (found.failure_class, found.pattern) == (failure_class, pattern)
    assert found.lines[0].startswith(first_line)


@pytest.mark.parametrize("tail", [logtails.CLEAN_OOM_NOISE, logtails.PYTHON_ERROR_ONLY, ""])
def test_unrecognised_tails_are_not_classified(tail: str) -> None:
    assert classifying.classify(tail) is None


def test_matching_lines_are_bounded_in_number_and_length() -> None:
    tail = "\n".join(f"host:1:2 [{i}] NCCL WARN Cuda failure 'out of memory' " + "x" * 500 for i in range(20))
    found = classifying.classify(tail, max_lines=3, max_line_length=50)
    assert found is not None
    assert len(found.lines) == 3
    assert all(len(line) == 50 for line in found.lines)
    assert found.lines[0].startswith("host:1:2 [0] NCCL WARN")


def test_equal_priorities_go_to_the_earliest_match() -> None:
    tail = "RuntimeError: CUDA error: unspecified launch failure\nRuntimeError: CUDA error: an illegal memory access was encountered\n"
    found = classifying.classify(tail)
    assert found is not None
    assert found.pattern == "cuda-unspecified-launch-failure"


def test_custom_patterns_replace_the_table() -> None:
    patterns = [classifying.Pattern.model_validate({"name": "dataloader", "regex": r"DataLoader worker \(pid \d+\) is killed",
                                                    "class": "application"})]
    tail = "RuntimeError: DataLoader worker (pid 4211) is killed by signal: Bus error.\nNCCL WARN x\n"
    found = classifying.classify(tail, patterns)
    assert found is not None
    assert (found.failure_class, found.pattern) == (APP, "dataloader")


def test_invalid_regex_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError):
        classifying.Pattern.model_validate({"name": "bad", "regex": "(unclosed", "class": "application"})


@pytest.mark.parametrize(("failure_class", "reason"), [
    (HW, "LogClassifiedHardwareSuspect"), (APP, "LogClassifiedApplication"), (COMM, "LogClassifiedCommunication"),
])
def test_reasons_are_camel_case(failure_class: classifying.FailureClass, reason: str) -> None:
    assert classifying.reason_for(failure_class) == reason
