"""ExGRPO: experience-replay GRPO for LLM reasoning, as a verl 0.9.1 recipe plus a verl-free core.

CPU install: ``pip install torch==2.13.0`` first (from PyTorch's CPU wheel index where PyPI would serve the CUDA
build), then ``pip install -e .[verl,data,test]``; ``run_scripts/install_cpu.sh`` does both, at the versions of
``constraints-cpu.txt``.
GPU install: ``run_scripts/install_gpu.sh``: torch 2.11 first, then flash-attn 2.8.3 (a prebuilt wheel, or built
without build isolation), then ``pip install -e .[gpu]``, the stack verl 0.9.1 pins for FSDP + vLLM. ``.[gpu]`` alone
in an empty environment cannot resolve: flash-attn's source archive imports torch in its setup.
"""

from setuptools import find_packages, setup

CORE = [
    "torch>=2.4",  # any installed build satisfies this; on CPU install torch==2.13.0 first
    "numpy>=1.24",
    "pandas>=2.0",
    "pyarrow>=15",
    "math-verify>=0.7",
    "pylatexenc>=2.10",  # the authors' evaluation grader (exgrpo/verifier/boxed.py) makes LaTeX plain with it
    "sympy>=1.12",
    "omegaconf>=2.3",
    "pyyaml>=6",
    "tqdm>=4.60",
    "transformers>=4.51",
    "tokenizers>=0.20",
    "matplotlib>=3.7",
]

EXTRAS = {
    "verl": ["verl[verl-core]==0.9.1"],
    # verl 0.9.1's own GPU pins: torch 2.11 + vLLM 0.24 + flash-attn 2.8.3 (FSDP) — GPU machines only, after torch and
    # flash-attn are in place (run_scripts/install_gpu.sh).
    "gpu": ["verl[verl-core,vllm,fsdp]==0.9.1"],
    "data": ["datasets>=2.18"],
    "test": ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100", "ruff>=0.5"],
}

setup(
    name="exgrpo",
    version="0.1.0",
    description="ExGRPO (learning to reason from experience) as a verl recipe with a CPU mode",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["exgrpo", "exgrpo.*", "recipe", "recipe.*", "data_preprocess",
                                    "data_preprocess.*"]),
    package_data={"exgrpo.embedded": ["configs/*.yaml"], "recipe.exgrpo": ["config/*.yaml"]},
    include_package_data=True,
    install_requires=CORE,
    extras_require=EXTRAS,
)
