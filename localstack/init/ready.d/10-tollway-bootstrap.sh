#!/bin/sh
# LocalStack runs the scripts in init/ready.d once it is ready. This one creates Tollway's queues,
# tables, buckets and secrets with the same bootstrap as `python -m tollway.cloud bootstrap`
# (tollway.cloud.bootstrap, from tollway.cloud.resources): it needs only Python and boto3, which
# LocalStack's own environment has.
#
#   TOLLWAY_SHARED   the repository's shared/ directory as mounted for LocalStack (default /opt/tollway/shared)
#   TOLLWAY_PYTHON   a Python with boto3 (default python3)
#   TOLLWAY_STAGE    the stage prefix (default tollway)
#   TOLLWAY_LOCALSTACK_ENDPOINT  where LocalStack answers (default $AWS_ENDPOINT_URL, else http://localhost:4566)
#   TOLLWAY_BOOTSTRAP_ARGS       extra arguments, e.g. "--secret openai=TOLLWAY_MOCK_PROVIDER_KEY"
set -eu

shared="${TOLLWAY_SHARED:-/opt/tollway/shared}"
if [ ! -d "$shared/tollway/cloud" ]; then
    echo "tollway bootstrap: $shared/tollway/cloud not found; mount the repository's shared/ there or set TOLLWAY_SHARED" >&2
    exit 1
fi
endpoint="${TOLLWAY_LOCALSTACK_ENDPOINT:-${AWS_ENDPOINT_URL:-http://localhost:4566}}"

# shellcheck disable=SC2086  # TOLLWAY_BOOTSTRAP_ARGS is a list of arguments
PYTHONPATH="$shared${PYTHONPATH:+:$PYTHONPATH}" exec "${TOLLWAY_PYTHON:-python3}" -m tollway.cloud bootstrap \
    --endpoint "$endpoint" \
    --region "${AWS_DEFAULT_REGION:-us-east-1}" \
    --prefix "${TOLLWAY_STAGE:-tollway}" \
    ${TOLLWAY_BOOTSTRAP_ARGS:-}
