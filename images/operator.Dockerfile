# The vramguard operator (kopf, with its admission webhooks).
# Build from the repository root (docs/install.md, "Images"):
#   docker build -f images/operator.Dockerfile -t <registry>/vramguard/operator:0.1.0 .
# or without a daemon: make images (hack/images/build.sh, buildah).
#
# Build arguments:
#   BASE      a Python 3.11+ image: the public slim image, or the Debian base that
#             hack/images/build.sh makes where no registry is reachable
#   PIP_CERT, PIP_FIND_LINKS, PIP_NO_INDEX  pip's settings for the first stage
#             (build.sh: the host's CA bundle; its wheelhouse, offline)
ARG BASE=python:3.12-slim

# Stage 1: a virtual environment at /opt/vramguard with the project's wheel and
# its "operator" extra (kopf, prometheus-client, cryptography, jsonpatch,
# orjson), at the pinned versions.
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
 && /opt/vramguard/bin/pip install -q -c images/constraints.txt ".[operator]" \
 && sh images/trim.sh /opt/vramguard vramguard_agent vramguard-agent

# Stage 2: the base and the environment; nothing from the build (sources, pip's
# cache, the CA bundle) comes along.
FROM ${BASE}
COPY --from=venv /opt/vramguard /opt/vramguard
# The root filesystem is read-only at run time: no .pyc writes.
ENV PATH=/opt/vramguard/bin:/usr/local/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# A name for 65532: kopf (and getpass.getuser()) look the user up in /etc/passwd.
RUN echo "vramguard:x:65532:65532:vramguard:/nonexistent:/usr/sbin/nologin" >>/etc/passwd \
 && echo "vramguard:x:65532:" >>/etc/group
# Numeric, so the kubelet can verify runAsNonRoot; matches the chart's runAsUser.
USER 65532:65532
EXPOSE 9443 8080 9090
ENTRYPOINT ["vramguard"]
CMD ["operator", "--standalone", "--all-namespaces"]
