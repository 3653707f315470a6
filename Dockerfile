# One image for both halves of Tessera: `tessera-extender` (Deployment) and `tessera-dra-driver`
# (DaemonSet). Build: docker build -t <registry>/tessera:0.1.0 .
#
# The base image is pinned by exact version (the Python the tests run on is 3.11). Pin its digest
# too where you build: docker buildx imagetools inspect python:3.11.14-slim-bookworm
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/tessera
# Runtime packages only, at the pinned versions (requirements-runtime.txt: pyproject's runtime
# dependencies and what they need); then the project itself without resolving anything more.
COPY requirements-runtime.txt ./
RUN /opt/tessera/bin/pip install --no-deps --only-binary=:all: -r requirements-runtime.txt
COPY pyproject.toml README.md ./
COPY contract ./contract
COPY extender ./extender
COPY dra_driver ./dra_driver
COPY tessera ./tessera
# (The build backend, setuptools, lives in pip's isolated build environment, not in the venv.)
RUN /opt/tessera/bin/pip install --no-deps .

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/tessera/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/tessera /opt/tessera
# Non-root by default (the extender); the DRA driver's DaemonSet runs as root, privileged, because
# it writes kubelet plugin sockets and drives the host's GPUs.
RUN groupadd --system --gid 65532 tessera \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin tessera
USER 65532:65532
# The chart sets the command; run bare, the image prints the extender's options.
CMD ["tessera-extender", "--help"]
