"""Build hami-py: the Python package plus the Cython allocation kernel in cython_core/."""
from setuptools import Extension, find_packages, setup
from Cython.Build import cythonize

# fit_kernel.pyx cimports kernel_codes.pxd (the numbers it shares with hami_py.reasons); cythonize
# finds it on include_path and rebuilds the kernel when it changes.
extensions = [
    Extension(
        "hami_py._kernel",
        ["cython_core/fit_kernel.pyx"],
        extra_compile_args=["-O2"],
        depends=["cython_core/kernel_codes.pxd"],
    ),
]

setup(
    name="hami-py",
    version="0.1.0",
    description="A HAMi-compatible Kubernetes scheduler extender for sharing GPUs between pods",
    packages=find_packages(include=["hami_py", "hami_py.*"]),
    package_data={"hami_py": ["data/*.yaml"]},
    ext_modules=cythonize(
        extensions,
        include_path=["cython_core"],
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    ),
    python_requires=">=3.11",
    install_requires=[
        "aiohttp", "kubernetes-asyncio", "orjson", "structlog", "prometheus-client", "PyYAML",
    ],
    # ``scheduler`` is the command HAMi's Helm chart runs in the extender container.
    entry_points={"console_scripts": ["hami-scheduler = hami_py.cli:main", "scheduler = hami_py.cli:main"]},
    zip_safe=False,
)
