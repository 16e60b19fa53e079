#!/bin/sh
# Streaming deployment: the Lambda Web Adapter runs this script as the function's handler
# (AWS_LAMBDA_EXEC_WRAPPER=/opt/bootstrap) and proxies each invocation to 127.0.0.1:$PORT,
# once GET $AWS_LWA_READINESS_CHECK_PATH (/healthz) answers 2xx. Locally the same script runs
# the same app: PYTHON=.venv/bin/python PORT=8080 functions/gateway/run.sh
set -eu
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
# On Lambda: layers unpack to /opt/python, the function code to /var/task.
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/opt/python:$here/../.."
exec "${PYTHON:-python3}" -m tollway.cli serve \
    --config "${TOLLWAY_CONFIG:-$here/llm-router.yml}" \
    --host 127.0.0.1 \
    --port "${PORT:-${AWS_LWA_PORT:-8080}}" \
    --workers 1 \
    --log-level "${TOLLWAY_LOG_LEVEL:-info}"
