# One image for both halves of Tessera: `tessera-extender` (Deployment) and `tessera-dra-driver`
# (DaemonSet). Build: docker build -t <registry>/tessera:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/tessera
COPY pyproject.toml README.md ./
COPY contract ./contract
COPY extender ./extender
COPY dra_driver ./dra_driver
COPY tessera ./tessera
RUN /opt/tessera/bin/pip install .

FROM python:3.11-slim
ENV PATH=/opt/tessera/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/tessera /opt/tessera
# Non-root by default (the extender); the DRA driver's DaemonSet runs as root, privileged, because
# it writes kubelet plugin sockets and drives the host's GPUs.
USER 65532:65532
# The chart sets the command; run bare, the image prints the extender's options.
CMD ["tessera-extender", "--help"]
