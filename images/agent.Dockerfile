# The vramguard node agent (NVML and cgroup sampling).
# Build from the repository root (docs/install.md, "Images"):
#   docker build -f images/agent.Dockerfile -t <registry>/vramguard/agent:0.1.0 .
# or without a daemon: make images (hack/images/build.sh, buildah).
# libnvidia-ml.so.1 is not in the image: the NVIDIA container runtime mounts the
# host driver's copy (NVIDIA_DRIVER_CAPABILITIES=utility).
#
# Build arguments:
#   BASE      a Python 3.11+ image: the public slim image, or the Debian base that
#             hack/images/build.sh makes where no registry is reachable
#   WITH_SIM  1: also install the simulated backends (the sim/ distribution, found
#             by the agent through its entry points) for the local cluster's real
#             node; product images leave it 0 and carry no simulator
#   PIP_CERT, PIP_FIND_LINKS, PIP_NO_INDEX  pip's settings for the first stage
#             (build.sh: the host's CA bundle; its wheelhouse, offline)
ARG BASE=python:3.12-slim

# Stage 1: a virtual environment at /opt/vramguard with the project's wheel and
# its "agent" extra (nvidia-ml-py, prometheus-client), at the pinned versions.
FROM ${BASE} AS venv
# build.sh: a CA bundle for pip, and a wheelhouse of the pins to install from
# alone (PIP_FIND_LINKS, PIP_NO_INDEX), mounted for this stage only.
ARG PIP_CERT
ARG PIP_FIND_LINKS
ARG PIP_NO_INDEX
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY . ./
RUN python3 -m venv /opt/vramguard \
 && /opt/vramguard/bin/pip install -q -c images/constraints.txt ".[agent]"
ARG WITH_SIM=0
# The kubernetes client requires aiohttp for its asyncio client (kubernetes.aio),
# which the agent never imports; the operator keeps aiohttp (kopf runs on it).
ENV AGENT_UNUSED="aiohttp aiohttp-retry aiohappyeyeballs aiosignal frozenlist multidict yarl propcache attrs"
RUN if [ "$WITH_SIM" = 1 ] && [ -d sim ]; then /opt/vramguard/bin/pip install -q -c images/constraints.txt ./sim; fi \
 && sh images/trim.sh /opt/vramguard vramguard_operator vramguard $AGENT_UNUSED

# Stage 2: the base and the environment; nothing from the build (sources, pip's
# cache, the CA bundle) comes along.
FROM ${BASE}
ARG WITH_SIM=0
LABEL io.vramguard.with-sim=${WITH_SIM}
COPY --from=venv /opt/vramguard /opt/vramguard
ENV PATH=/opt/vramguard/bin:/usr/local/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility
# A name for 65532: kopf (and getpass.getuser()) look the user up in /etc/passwd.
RUN echo "vramguard:x:65532:65532:vramguard:/nonexistent:/usr/sbin/nologin" >>/etc/passwd \
 && echo "vramguard:x:65532:" >>/etc/group
# Numeric, so the kubelet can verify runAsNonRoot; matches the chart's runAsUser.
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["vramguard-agent"]
CMD ["run", "--backend=nvml", "--proc-root=/host/proc", "--cgroup-root=/host/sys/fs/cgroup"]
