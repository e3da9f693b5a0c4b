# hami-py image: `make image` (docker build -t hami-py:dev .).
#
# Stage 1 compiles the Cython allocation kernel and installs hami-py with its pinned runtime
# dependencies into a virtualenv; stage 2 is the slim Python image plus that virtualenv, with no
# compiler, no Cython and no sources beyond the installed package. The result runs as a
# non-root user and writes nothing to its root filesystem (the Deployment mounts it read-only).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN python -m venv /opt/hami-py
ENV PATH=/opt/hami-py/bin:$PATH
COPY requirements.txt ./
RUN pip install --no-cache-dir --disable-pip-version-check -r requirements.txt
COPY setup.py ./
COPY cython_core ./cython_core
COPY hami_py ./hami_py
# --no-build-isolation: build with the pinned Cython and setuptools installed above. The import
# check runs outside /src so it loads the installed package (with its compiled kernel).
RUN pip install --no-cache-dir --disable-pip-version-check --no-build-isolation . \
 && cd / && python -c "import hami_py._kernel" \
 && pip uninstall -y --disable-pip-version-check Cython setuptools wheel

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/hami-py /opt/hami-py
ENV PATH=/opt/hami-py/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 8443 9395
ENTRYPOINT ["hami-scheduler"]
