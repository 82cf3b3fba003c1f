# The vramguard operator (kopf, with its admission webhooks).
# Build from the repository root:
#   docker build -f images/operator.Dockerfile -t <registry>/vramguard/operator:0.1.0 .
# Not built in this repository's CI (no container engine there); see docs/install.md.

# Stage 1: one wheel for the whole project; both images install it.
FROM python:3.12-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api ./api
COPY operator ./operator
COPY agent ./agent
RUN pip wheel --no-deps --no-cache-dir --wheel-dir /wheels .

# Stage 2: the wheel with the "operator" extra (kopf, prometheus-client, cryptography).
FROM python:3.12-slim
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/vramguard-*.whl)[operator]" && rm -rf /wheels
# The root filesystem is read-only at run time: no .pyc writes.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Numeric, so the kubelet can verify runAsNonRoot; matches the chart's runAsUser.
USER 65532:65532
EXPOSE 9443 8080 9090
ENTRYPOINT ["vramguard"]
CMD ["operator", "--standalone", "--all-namespaces"]
