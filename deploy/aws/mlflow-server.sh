#!/bin/bash
# The team's MLflow server on one EC2 instance: user data for Amazon Linux 2023, run once as root at
# the instance's first boot (deploy/aws/README.md, step 3, launches the instance with it).
#
# The tracking server's image in Docker (deploy/mlflow.Dockerfile, pushed to ECR in step 2; the one
# deploy/kuberay/mlflow.yaml runs) with its basic-auth app and the PostgreSQL driver psycopg 3:
# runs, the model registry and the logins in PostgreSQL on the RDS instance nmt-mlflow (databases
# mlflow and mlflow_auth, owned by the database user mlflow), artifacts in the bucket under
# mlflow-artifacts/, port 5000 (the instance's security group admits the VPC only). Docker restarts
# the server after a crash or a reboot.
#
# No secret is in this file or on a command line. The RDS master password is RDS's own secret in
# Secrets Manager, read once here to create the database user. The database user's password, the
# MLflow admin's password and the Flask key are made here on the first boot and kept in SSM
# SecureString parameters under /nmt/mlflow/server/, so a replacement instance finds the same ones.
# Replace YOUR-BUCKET below before launching. Its log: /var/log/cloud-init-output.log.
set -euo pipefail
shopt -s inherit_errexit  # a failing command inside $(...) stops the script too

BUCKET=YOUR-BUCKET
REGISTRY=123456789012.dkr.ecr.us-west-2.amazonaws.com
IMAGE=$REGISTRY/nmt-mlflow:3.17.2
DB_INSTANCE=nmt-mlflow
PARAMETERS=/nmt/mlflow/server
HOSTS="mlflow.internal:5000,localhost:*,127.0.0.1:*"   # Host headers it answers: the nodes' name, port forwards

imds=$(curl -fsS -X PUT http://169.254.169.254/latest/api/token -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')
AWS_DEFAULT_REGION=$(curl -fsS -H "X-aws-ec2-metadata-token: $imds" \
    http://169.254.169.254/latest/meta-data/placement/region)
export AWS_DEFAULT_REGION

dnf install -y docker
systemctl enable --now docker
aws ecr get-login-password | docker login --username AWS --password-stdin "$REGISTRY"
docker pull "$IMAGE"

umask 077
install -d -m 700 /etc/mlflow

# The value of a SecureString parameter of this server: read it, or on the first boot make it.
secret() {
    local name="$PARAMETERS/$1"
    if ! aws ssm get-parameter --name "$name" --with-decryption --query Parameter.Value --output text 2>/dev/null; then
        openssl rand -hex "$2" | tr -d '\n' > /etc/mlflow/new-value
        aws ssm put-parameter --name "$name" --type SecureString --value file:///etc/mlflow/new-value >/dev/null
        cat /etc/mlflow/new-value
        rm -f /etc/mlflow/new-value
    fi
}
db_password=$(secret db-password 24)
admin_password=$(secret admin-password 24)
flask_key=$(secret flask-secret-key 32)

# The database user and its two databases, made with the RDS master login (idempotent). The image's
# ENTRYPOINT is `mlflow server`: this one-off step runs its Python instead.
read -r db_host master_user master_secret <<<"$(aws rds describe-db-instances --db-instance-identifier "$DB_INSTANCE" \
    --query 'DBInstances[0].[Endpoint.Address,MasterUsername,MasterUserSecret.SecretArn]' --output text)"
master_password=$(aws secretsmanager get-secret-value --secret-id "$master_secret" --query SecretString --output text \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["password"])')
PGHOST=$db_host PGUSER=$master_user PGPASSWORD=$master_password PGDATABASE=postgres PGSSLMODE=require \
DB_PASSWORD=$db_password docker run --rm -i --network host --entrypoint python \
    -e PGHOST -e PGUSER -e PGPASSWORD -e PGDATABASE -e PGSSLMODE -e DB_PASSWORD "$IMAGE" - <<'EOF'
import os

import psycopg
from psycopg import sql

connection = psycopg.connect(autocommit=True)  # from the PG* variables
exists = connection.execute("SELECT 1 FROM pg_roles WHERE rolname = 'mlflow'").fetchone()
verb = "ALTER" if exists else "CREATE"
connection.execute(sql.SQL(verb + " ROLE mlflow LOGIN PASSWORD {}").format(sql.Literal(os.environ["DB_PASSWORD"])))
connection.execute("GRANT mlflow TO CURRENT_USER")  # RDS's master is no superuser: it may then hand databases over
for name in ("mlflow", "mlflow_auth"):
    if not connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
        connection.execute(sql.SQL("CREATE DATABASE {} OWNER mlflow").format(sql.Identifier(name)))
EOF
unset master_password

# The server's settings: readable by root and the container's user only. The database password is in
# PGPASSWORD (libpq reads it), in no URI. Sizing as deploy/tracking-server.md says: one worker (the
# t3.small's burst), its pool 20 (+60) connections to each database: at most 160, within what a
# db.t4g.small allows (about 225); a login cached 60 s.
# With workspaces on, every login keeps READ and only members of the nmt-creators role create
# experiments and registered models (deploy/mlflow_users.py): the serving login creates nothing.
cat > /etc/mlflow/basic_auth.ini <<EOF
[mlflow]
default_permission = READ
grant_default_workspace_access = true
database_uri = postgresql+psycopg://mlflow@$db_host:5432/mlflow_auth?sslmode=require
admin_username = admin
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = 60
EOF
cat > /etc/mlflow/env <<EOF
MLFLOW_BACKEND_STORE_URI=postgresql+psycopg://mlflow@$db_host:5432/mlflow?sslmode=require
PGPASSWORD=$db_password
MLFLOW_SQLALCHEMYSTORE_POOL_SIZE=20
MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW=60
MLFLOW_SQLALCHEMYSTORE_POOL_RECYCLE=1800
MLFLOW_DISABLE_TELEMETRY=true
MLFLOW_AUTH_CONFIG_PATH=/etc/mlflow/basic_auth.ini
MLFLOW_AUTH_ADMIN_PASSWORD=$admin_password
MLFLOW_FLASK_SERVER_SECRET_KEY=$flask_key
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
HOME=/tmp
EOF
chown -R 10001:10001 /etc/mlflow

# The image's ENTRYPOINT is `mlflow server`: what follows the image is that command's options.
# Artifacts reach the bucket with the instance's role (host network: the container reaches the
# instance metadata service like the host does).
docker run -d --name mlflow --restart unless-stopped --network host --user 10001:10001 \
    --env-file /etc/mlflow/env -v /etc/mlflow:/etc/mlflow:ro "$IMAGE" \
    --host 0.0.0.0 --port 5000 --workers 1 --app-name basic-auth --enable-workspaces \
    --artifacts-destination "s3://$BUCKET/mlflow-artifacts" --allowed-hosts "$HOSTS"
