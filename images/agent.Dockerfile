# The vramguard node agent (NVML and cgroup sampling).
# Build from the repository root:
#   docker build -f images/agent.Dockerfile -t <registry>/vramguard/agent:0.1.0 .
# Not built in this repository's CI (no container engine there); see docs/install.md.
# libnvidia-ml.so.1 is not in the image: the NVIDIA container runtime mounts the
# host driver's copy (NVIDIA_DRIVER_CAPABILITIES=utility).

# Stage 1: one wheel for the whole project; both images install it.
FROM python:3.12-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api ./api
COPY operator ./operator
COPY agent ./agent
RUN pip wheel --no-deps --no-cache-dir --wheel-dir /wheels .

# Stage 2: the wheel with the "agent" extra (nvidia-ml-py, prometheus-client).
FROM python:3.12-slim
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/vramguard-*.whl)[agent]" && rm -rf /wheels
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility
# Numeric, so the kubelet can verify runAsNonRoot; matches the chart's runAsUser.
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["vramguard-agent"]
CMD ["run", "--backend=nvml", "--proc-root=/host/proc", "--cgroup-root=/host/sys/fs/cgroup"]
