# The team's MLflow tracking server (deploy/kuberay/mlflow.yaml, deploy/aws/mlflow-server.sh): MLflow's
# release image with its basic-auth app, the maintained PostgreSQL driver (psycopg 3, binary wheel)
# and boto3 for artifacts on S3, at the MLflow version this project's client is tested with.
# Build from the project root and push where the cluster pulls from:
#   docker build -f deploy/mlflow.Dockerfile -t REGISTRY/nmt-mlflow:3.17.2 .
#   docker push REGISTRY/nmt-mlflow:3.17.2
ARG MLFLOW_VERSION=3.17.2
FROM ghcr.io/mlflow/mlflow:v${MLFLOW_VERSION}
ARG MLFLOW_VERSION
RUN pip install --no-cache-dir "mlflow[auth]==${MLFLOW_VERSION}" "psycopg[binary]>=3.1,<4" "boto3>=1.34" \
    && python -c "import psycopg, boto3, flask_wtf, mlflow; assert mlflow.__version__ == '${MLFLOW_VERSION}'"
# Any non-root uid: the server writes nothing but temporary uploads (/tmp, an emptyDir in the pod).
USER 10001
ENTRYPOINT ["mlflow", "server"]
