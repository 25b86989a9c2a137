"""The model the kernel tests run on CUDA: `nano` with the engram memory on (so its gate and dilated conv
run too) and dropout off (a training forward with dropout needs the step's mask generator)."""

from dormouse.config import Config, build
from dormouse.resolve import resolve

KERNEL_TEST_MODEL = {"engram": True, "dropout": 0.0}


def nano_on_cuda() -> Config:
    return resolve(build("nano", {"model": KERNEL_TEST_MODEL}), cuda_available=True)
