"""deploy/kuberay locked down for a shared Kubernetes cluster: a token Secret per Ray cluster, pods as
deploy/Dockerfile's non-root user without privileges, a Kubernetes API token only in the autoscaler sidecar,
NetworkPolicies that admit, port by port, what each pod must be reached by and nothing else, members' rights
by name only, and the read-only serving login apart from a job's writable one.
"""

from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path

from deploy_files import (
    DEPLOY,
    MLFLOW_SERVER,
    RAY_KINDS,
    by_kind,
    cluster_spec,
    container_env,
    containers,
    defined_objects,
    groups,
    header,
    namespace,
    objects,
    pod_specs,
    prerequisites,
    ray_clusters,
    steps,
)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where a pod's API token is mounted


def test_each_ray_cluster_has_a_token_secret_of_its_own():
    """A job holds its own cluster's token only: it cannot submit to another cluster or redeploy the service."""
    readme = steps((DEPLOY / "kuberay" / "README.md").read_text().replace("\\\n", " "))
    secrets = {}
    for path, doc in objects():
        if doc["kind"] not in RAY_KINDS:
            continue
        auth = cluster_spec(doc)["authOptions"]
        secret = auth["secretName"]
        assert auth["mode"] == "token" and secret == f"{doc['metadata']['name']}-ray-token", path.name
        secrets[path.name] = secret
        # The header, and deploy/kuberay/README.md before applying the file, make this token and no other cluster's.
        made = {arg for verb, _, arg, _ in steps(header(path)) if verb == "create secret generic"}
        assert {s for s in made if s.endswith("-ray-token")} == {secret}, path.name
        applied = readme.index(("apply -f", "", f"deploy/kuberay/{path.name}", set()))
        tokens = [arg for verb, _, arg, _ in readme[:applied] if verb == "create secret generic" and "ray-token" in arg]
        assert tokens and tokens[-1] == secret, f"deploy/kuberay/README.md applies {path.name} after making {tokens}"
    assert len(set(secrets.values())) == len(secrets) == 3, secrets


def _dockerfile_user() -> tuple[int, int]:
    """The uid and gid of deploy/Dockerfile's last USER, which must be numeric for runAsNonRoot to be checked."""
    users = re.findall(r"^USER (\S+)$", (DEPLOY / "Dockerfile").read_text(), re.M)
    assert users and re.fullmatch(r"\d+:\d+", users[-1]), f"deploy/Dockerfile's USER {users[-1:]}: uid:gid in numbers"
    uid, gid = map(int, users[-1].split(":"))
    return uid, gid


def test_pods_run_as_a_non_root_user_without_privileges():
    """Every pod, Ray and MLflow: non-root (the Ray pods as the image's user), RuntimeDefault seccomp, no capability."""
    uid, gid = _dockerfile_user()
    assert uid != 0
    pods = [(f"{p.name} {d['kind']}", d, pod) for p, d in objects() for pod in pod_specs(d)]
    assert {d["kind"] for _, d, _ in pods} == {*RAY_KINDS, "StatefulSet"}
    for where, doc, pod in pods:
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0, where
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
        if doc["kind"] in RAY_KINDS:
            assert (context["runAsUser"], context.get("runAsGroup")) == (uid, gid), f"{where}: not the image's user"
        for container in containers(pod):
            _assert_unprivileged(container.get("securityContext", {}), f"{where} {container['name']}")
    for where, _, spec in ray_clusters():
        if spec.get("enableInTreeAutoscaling"):  # KubeRay injects the sidecar with autoscalerOptions' securityContext
            _assert_unprivileged(spec["autoscalerOptions"].get("securityContext", {}), f"{where} autoscaler")


def _assert_unprivileged(security: dict, where: str) -> None:
    assert security.get("allowPrivilegeEscalation") is False, f"{where}: the image's user may sudo"
    assert security.get("capabilities", {}).get("drop") == ["ALL"], where
    assert not security["capabilities"].get("add") and not security.get("privileged"), where
    assert security.get("runAsUser") != 0, where


def test_only_the_autoscaler_sidecar_holds_a_kubernetes_api_token():
    """KubeRay's autoscaler role may patch every pod and RayCluster of the namespace: no Ray container may hold it."""
    import ray.autoscaler

    provider = Path(ray.autoscaler.__file__).parent / "_private" / "kuberay" / "node_provider.py"
    assert f'IN_CLUSTER_TOKEN_PATH = "{SERVICE_ACCOUNT_DIR}/token"' in provider.read_text(), "Ray reads it elsewhere"
    for path, doc in objects():
        for pod in pod_specs(doc):
            where = f"{path.name} {doc['kind']}"
            assert pod.get("automountServiceAccountToken") is False, f"{where}: the kubelet would mount the token"
            tokens = {v["name"] for v in pod.get("volumes", [])
                      if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))}
            for container in containers(pod):
                assert not {m["name"] for m in container.get("volumeMounts", [])} & tokens, where
    for where, _, spec in ray_clusters():
        head = spec["headGroupSpec"]["template"]["spec"]
        volumes = {v["name"]: v for v in head.get("volumes", [])}
        mounts = spec.get("autoscalerOptions", {}).get("volumeMounts", [])
        if not spec.get("enableInTreeAutoscaling"):
            assert not mounts, where
            continue
        # The sidecar gets what the kubelet would have mounted: the token, the cluster's CA and the namespace.
        [mount] = [m for m in mounts if m["mountPath"] == SERVICE_ACCOUNT_DIR]
        assert mount.get("readOnly") is True, where
        sources = volumes[mount["name"]]["projected"]["sources"]
        assert {"serviceAccountToken": {"path": "token"}} in sources, where
        assert {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}} in sources


# The NetworkPolicies, evaluated as Kubernetes does for a connection from one pod to another. The Ray
# files go to kubectl's current namespace: here the one kuberay/mlflow.yaml's policy names.
RAY_NAMESPACE = "default"
RAY_PORTS = (6379, 8265, 10001, 8000, 8076, 52365, 23456)  # GCS, dashboard, client, Serve, objects, agent, a worker
CONTROL_PORTS = (8265, 6379, 10001)  # dashboard and Jobs API, GCS, Ray client
OTHER_NAMESPACE = "team-b"
PLAIN_POD = {"app.kubernetes.io/name": "notebook"}
ADMIN_POD = {"nmt-admin": "true"}
GATEWAY_POD = {"nmt-client": "true"}
MLFLOW_CLIENT_POD = {"nmt-mlflow-client": "true"}
INGRESS_CONTROLLER = ("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"})


@functools.cache
def _network_policies() -> tuple[dict, ...]:
    return tuple(d for _, d in by_kind("NetworkPolicy"))


def _selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, f"{selector}: matchExpressions are not evaluated here"
    return selector.get("matchLabels", {}).items() <= labels.items()


def _admitted(source: tuple[str, dict], target: tuple[str, dict], port: int) -> bool:
    """Whether a pod (namespace, labels) may open a TCP connection to another pod's port under the policies here."""
    (source_ns, source_labels), (target_ns, target_labels) = source, target
    policies = [d for d in _network_policies() if (namespace(d) or RAY_NAMESPACE) == target_ns
                and "Ingress" in d["spec"]["policyTypes"] and _selects(d["spec"]["podSelector"], target_labels)]
    if not policies:
        return True  # a pod no policy selects accepts everything
    for rule in (rule for policy in policies for rule in policy["spec"].get("ingress", [])):
        ports = rule.get("ports", [])
        assert all(isinstance(p["port"], int) and p.get("protocol", "TCP") == "TCP" for p in ports), ports
        if ports and port not in {p["port"] for p in ports}:
            continue
        for peer in rule.get("from", [{"namespaceSelector": {}}]):
            assert "ipBlock" not in peer, peer
            in_namespace = (_selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": source_ns})
                            if "namespaceSelector" in peer else source_ns == target_ns)
            if in_namespace and _selects(peer.get("podSelector", {}), source_labels):
                return True
    return False


def _ray_pods(doc: dict) -> list[tuple[dict, dict]]:
    """(pod spec, labels) of the Ray pods KubeRay makes: the template's labels over its own (common/pod.go labelPod)."""
    spec = cluster_spec(doc)
    cluster = doc["metadata"]["name"] + ("" if doc["kind"] == "RayCluster" else "-x7k2p")  # a RayJob's: a suffix
    pods = []
    for group in groups(spec):
        node_type, name = ("head", "headgroup") if group is spec["headGroupSpec"] else ("worker", group["groupName"])
        labels = {"ray.io/is-ray-node": "yes", "ray.io/cluster": cluster, "ray.io/node-type": node_type,
                  "ray.io/group": name, "app.kubernetes.io/name": "kuberay",
                  "app.kubernetes.io/created-by": "kuberay-operator"}
        pods.append((group["template"]["spec"], {**labels, **group["template"]["metadata"].get("labels", {})}))
    return pods


def _operator_pod() -> dict:
    """The KubeRay operator's pod labels (its Helm chart), installed in the namespace of the Ray files (step 2)."""
    [operator] = [r["name"] for r in prerequisites() if r["kind"] == "Operator"]
    return {"app.kubernetes.io/name": operator, "app.kubernetes.io/instance": operator}


def _submitter_pod(doc: dict) -> dict:
    """The labels of a RayJob's submitter pod: its template's and those KubeRay adds (rayjob_controller.go)."""
    labels = doc["spec"].get("submitterPodTemplate", {}).get("metadata", {}).get("labels", {})
    return {**labels, "ray.io/originated-from-cr-name": doc["metadata"]["name"],
            "ray.io/originated-from-crd": "RayJob", "app.kubernetes.io/created-by": "kuberay-operator"}


def test_ray_pods_reach_their_own_cluster_on_every_port_and_nothing_reaches_them_from_another():
    clusters = {where: _ray_pods(doc) for where, doc, _ in ray_clusters()}
    for where, pods in clusters.items():
        for (_, a), (_, b) in itertools.product(pods, repeat=2):
            for port in RAY_PORTS:
                assert _admitted((RAY_NAMESPACE, a), (RAY_NAMESPACE, b), port), f"{where}: Ray's port {port}"
                assert not _admitted((OTHER_NAMESPACE, a), (RAY_NAMESPACE, b), port), f"{where}: a look-alike pod"
                assert not _admitted((RAY_NAMESPACE, PLAIN_POD), (RAY_NAMESPACE, b), port), where
        for other, other_pods in clusters.items():
            for (_, a), (_, b) in itertools.product(other_pods, pods):
                if other != where:
                    assert not any(_admitted((RAY_NAMESPACE, a), (RAY_NAMESPACE, b), p) for p in RAY_PORTS), \
                        f"{other} reaches {where}"


def test_ray_control_ports_admit_only_an_admin_pod_the_operator_and_the_jobs_submitter():
    """Dashboard and Jobs API, GCS, client: the labelled admin pod; the operator and submitter where KubeRay calls."""
    operator = _operator_pod()
    for where, doc, _ in ray_clusters():
        head = (RAY_NAMESPACE, _ray_pods(doc)[0][1])
        ports = {p["containerPort"] for p in _ray_pods(doc)[0][0]["containers"][0]["ports"]}
        assert set(CONTROL_PORTS) <= ports, where
        for port in CONTROL_PORTS:
            assert _admitted((RAY_NAMESPACE, ADMIN_POD), head, port), f"{where}: an admin pod on {port}"
            assert not _admitted((OTHER_NAMESPACE, ADMIN_POD), head, port), f"{where}: the admin label elsewhere"
            for client in (PLAIN_POD, GATEWAY_POD, MLFLOW_CLIENT_POD):
                assert not _admitted((RAY_NAMESPACE, client), head, port), f"{where}: {client} on {port}"
            # The operator follows a RayJob and deploys a RayService through the dashboard; nothing else.
            assert _admitted((RAY_NAMESPACE, operator), head, port) == (
                port == 8265 and doc["kind"] in ("RayJob", "RayService")), f"{where}: the operator on {port}"
            assert not _admitted((OTHER_NAMESPACE, operator), head, port), where
        for _, job, _ in ray_clusters():
            if job["kind"] == "RayJob":  # its submitter runs `ray job submit` against its own head only
                submitter = (RAY_NAMESPACE, _submitter_pod(job))
                own = job["metadata"]["name"] == doc["metadata"]["name"] and doc["kind"] == "RayJob"
                assert _admitted(submitter, head, 8265) == own, f"{where}: the submitter of {job['metadata']['name']}"
                assert not _admitted(submitter, head, 6379), where


def test_serve_port_admits_the_labelled_gateway_and_the_ingress_controller_only():
    operator = _operator_pod()
    serving = 0
    for where, doc, _ in ray_clusters():
        for index, (pod, labels) in enumerate(_ray_pods(doc)):
            if 8000 not in {p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}:
                continue
            serving += 1
            target = (RAY_NAMESPACE, labels)
            assert _admitted((RAY_NAMESPACE, GATEWAY_POD), target, 8000), f"{where}: your gateway"
            assert _admitted(INGRESS_CONTROLLER, target, 8000), f"{where}: the ingress controller"
            assert not _admitted((OTHER_NAMESPACE, GATEWAY_POD), target, 8000), f"{where}: the label elsewhere"
            for client in (PLAIN_POD, ADMIN_POD, MLFLOW_CLIENT_POD):
                assert not _admitted((RAY_NAMESPACE, client), target, 8000), f"{where}: {client}"
            for port in CONTROL_PORTS:
                assert not _admitted((RAY_NAMESPACE, GATEWAY_POD), target, port), f"{where}: the gateway on {port}"
                assert not _admitted(INGRESS_CONTROLLER, target, port), f"{where}: the ingress controller on {port}"
            # KubeRay checks the service head's Serve proxy before sending it traffic.
            if doc["kind"] == "RayService" and index == 0:
                assert _admitted((RAY_NAMESPACE, operator), target, 8000), where
    assert serving >= 3, "the RayService's head and workers and the RayCluster's head serve"


def test_mlflow_admits_the_ray_pods_and_labelled_clients_only():
    defined = defined_objects()
    deployment = defined[MLFLOW_SERVER]
    server = ("mlflow", deployment["spec"]["template"]["metadata"]["labels"])
    [port] = [p["containerPort"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]]
    for where, doc, _ in ray_clusters():
        for _, labels in _ray_pods(doc):
            assert _admitted((RAY_NAMESPACE, labels), server, port), f"{where}: a Ray pod"
            assert not _admitted((OTHER_NAMESPACE, labels), server, port), f"{where}: a look-alike in another namespace"
    assert _admitted((RAY_NAMESPACE, MLFLOW_CLIENT_POD), server, port)
    assert not _admitted((OTHER_NAMESPACE, MLFLOW_CLIENT_POD), server, port)
    for client in (PLAIN_POD, ADMIN_POD, GATEWAY_POD, _submitter_pod(by_kind("RayJob")[0][1])):
        assert not _admitted((RAY_NAMESPACE, client), server, port), client
    assert not _admitted(INGRESS_CONTROLLER, server, port)


# Egress: where a pod may open connections to, evaluated as Kubernetes does (a pod no egress policy selects may
# connect anywhere; once one selects it, only what some rule allows).
DNS = ("kube-system", {"k8s-app": "kube-dns"})
OBJECT_STORAGE = "52.216.8.1"  # an S3 address
PRIVATE = ("10.0.12.7", "172.20.0.5", "192.168.1.9", "100.64.3.2")  # nodes, another team's database, a VPC service
METADATA = "169.254.169.254"  # the cloud's instance metadata: the node's credentials
API_SERVER_PLACEHOLDER, API_SERVER = "API-SERVER-IP", "172.20.0.1"  # what you put there: the API server's endpoint


def _ip_in(ip: str, block: dict) -> bool:
    import ipaddress

    address = ipaddress.ip_address(ip)
    cidr = block["cidr"].replace(API_SERVER_PLACEHOLDER, API_SERVER)
    return address in ipaddress.ip_network(cidr) and not any(
        address in ipaddress.ip_network(e) for e in block.get("except", []))


def _egress(source: tuple[str, dict], target: tuple[str, dict] | str, port: int, protocol: str = "TCP") -> bool:
    """Whether a pod may connect to a pod (namespace, labels) or an IP address outside the cluster on a port."""
    source_ns, source_labels = source
    policies = [d for d in _network_policies() if (namespace(d) or RAY_NAMESPACE) == source_ns
                and "Egress" in d["spec"]["policyTypes"] and _selects(d["spec"]["podSelector"], source_labels)]
    if not policies:
        return True
    for rule in (rule for policy in policies for rule in policy["spec"].get("egress", [])):
        ports = rule.get("ports", [])
        if ports and (port, protocol) not in {(p["port"], p.get("protocol", "TCP")) for p in ports}:
            continue
        for peer in rule.get("to", [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"namespaceSelector": {}}]):
            if isinstance(target, str):
                if "ipBlock" in peer and _ip_in(target, peer["ipBlock"]):
                    return True
                continue
            target_ns, target_labels = target
            if "ipBlock" in peer:
                continue
            in_namespace = (_selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": target_ns})
                            if "namespaceSelector" in peer else target_ns == source_ns)
            if in_namespace and _selects(peer.get("podSelector", {}), target_labels):
                return True
    return False


def test_ray_pods_reach_each_other_dns_mlflow_and_object_storage_and_nothing_else():
    defined = defined_objects()
    deployment = defined[MLFLOW_SERVER]
    mlflow = ("mlflow", deployment["spec"]["template"]["metadata"]["labels"])
    clusters = {where: _ray_pods(doc) for where, doc, _ in ray_clusters()}
    for where, pods in clusters.items():
        for _, labels in pods:
            pod = (RAY_NAMESPACE, labels)
            for _, peer in pods:
                assert all(_egress(pod, (RAY_NAMESPACE, peer), p) for p in RAY_PORTS), f"{where}: its own cluster"
            assert _egress(pod, DNS, 53, "UDP") and _egress(pod, DNS, 53, "TCP"), f"{where}: DNS"
            assert _egress(pod, mlflow, 5000) and not _egress(pod, mlflow, 5432), f"{where}: MLflow's port only"
            assert _egress(pod, OBJECT_STORAGE, 443), f"{where}: object storage over HTTPS"
            assert not _egress(pod, OBJECT_STORAGE, 22) and not _egress(pod, OBJECT_STORAGE, 80), where
            assert not any(_egress(pod, ip, 80) or _egress(pod, ip, 5432) for ip in (METADATA, *PRIVATE)), where
            assert not any(_egress(pod, ip, 443) for ip in (METADATA, *PRIVATE)), where
            for client in (PLAIN_POD, ADMIN_POD, GATEWAY_POD):
                assert not _egress(pod, (RAY_NAMESPACE, client), 8000), f"{where}: {client}"
            for other, other_pods in clusters.items():
                if other != where:
                    assert not any(_egress(pod, (RAY_NAMESPACE, b), 6379) for _, b in other_pods), f"{where}: {other}"


def test_head_pods_reach_the_api_server_at_its_address_alone_and_no_private_service_on_443_or_6443():
    """The autoscaler sidecar needs the API server; the Ray container beside it, where jobs' drivers run, must
    not reach another team's HTTPS service, the nodes' kubelets or the metadata service on those ports."""
    for path, doc in objects():
        if doc["kind"] not in RAY_KINDS:
            continue
        spec = cluster_spec(doc)
        for _, labels in _ray_pods(doc):
            pod = (RAY_NAMESPACE, labels)
            reaches_api = {port: _egress(pod, API_SERVER, port) for port in (443, 6443)}
            head_autoscales = labels["ray.io/node-type"] == "head" and spec.get("enableInTreeAutoscaling", False)
            assert reaches_api == {443: head_autoscales, 6443: head_autoscales}, f"{path.name}: {labels}"
            for port in (443, 6443):
                assert not any(_egress(pod, ip, port) for ip in (METADATA, *PRIVATE)), f"{path.name}: {port}"
            assert not _egress(pod, OBJECT_STORAGE, 6443), f"{path.name}: 6443 outside the cluster"
        if spec.get("enableInTreeAutoscaling"):
            assert f"{API_SERVER_PLACEHOLDER} (the last policy)" in header(path).replace("\n", " "), \
                f"{path.name}'s header must say to replace {API_SERVER_PLACEHOLDER}"


def test_ray_containers_have_a_read_only_root_filesystem_and_scratch_where_ray_writes():
    """Ray writes its session directory under /tmp, caches under ~/.cache, settings (nmt's state key) ~/.config."""
    for where, doc, _ in ray_clusters():
        for pod, labels in _ray_pods(doc):
            volumes = {v["name"]: v for v in pod["volumes"]}
            for container in pod["containers"]:
                assert container["securityContext"].get("readOnlyRootFilesystem") is True, where
                writable = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
                for path in ("/tmp", "/home/ray/.cache", "/home/ray/.config", "/dev/shm"):
                    assert "emptyDir" in writable[path], f"{where} {labels['ray.io/group']}: {path}"


def test_the_image_keeps_the_project_out_of_the_ray_users_hands():
    """The editable install is root's: a job running as the ray user cannot rewrite the code other jobs import."""
    lines = [line.strip() for line in (DEPLOY / "Dockerfile").read_text().splitlines()]
    user = "ray"  # the base image's
    for line in lines:
        if line.startswith("USER "):
            user = line.split()[1]
        if line.startswith("COPY "):
            assert "--chown" not in line and user in ("root", "0"), f"{line}: as {user}"
        if "pip install" in line and " -e ." in " ".join(lines[lines.index(line):lines.index(line) + 2]):
            assert user in ("root", "0"), f"the project is installed as {user}"
    assert user == "1000:100"  # and the containers run as the ray user again


# ---- who may do what: members' RBAC and the MLflow logins the pods run with ----

def _member_grants() -> set[tuple[str, str, str, str]]:
    """(namespace, resource, name, verb) of every rule members.yaml's RoleBindings give the members' group."""
    roles = {(namespace(d), d["metadata"]["name"]): d for _, d in by_kind("Role")}
    grants = set()
    for path, binding in by_kind("RoleBinding"):
        assert binding["roleRef"]["kind"] == "Role", f"{path.name}: a ClusterRole's rules reach every namespace"
        members = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "nmt-members"}
        assert binding["subjects"] == [members]
        for rule in roles[(namespace(binding), binding["roleRef"]["name"])]["rules"]:
            assert rule.get("resourceNames"), f"{path.name}: {rule} grants every object of its kind, not some by name"
            assert rule["apiGroups"] == [""] and not {"*", "list", "watch"} & set(rule["verbs"]), rule
            grants |= set(itertools.product([namespace(binding)], rule["resources"], rule["resourceNames"],
                                            rule["verbs"]))
    return grants


def test_members_get_by_name_only_the_team_clusters_token_and_a_port_forward_to_its_head_and_mlflow():
    """Not the RayService's token or pods (a port-forward and its token would `serve deploy` any code onto it), no
    job's token or MLflow login, no database pod, no exec, no list; the pods by the names KubeRay and the
    StatefulSet give them."""
    defined = defined_objects()
    [(_, team)] = by_kind("RayCluster")
    # KubeRay's utils.PodName with ENABLE_DETERMINISTIC_HEAD_POD_NAME=true: the cluster's name and "-head".
    assert "ENABLE_DETERMINISTIC_HEAD_POD_NAME=true" in header(DEPLOY / "kuberay" / "members.yaml")
    head = f"{team['metadata']['name'][:50]}-head".lower()
    server = defined[MLFLOW_SERVER]
    assert server["kind"] == "StatefulSet", "a Deployment's pods have random names RBAC cannot grant"
    mlflow_pods = {f"{server['metadata']['name']}-{i}" for i in range(server["spec"]["replicas"])}
    forward = {("get", "pods"), ("get", "pods/portforward"), ("create", "pods/portforward")}
    expected = {("", "secrets", cluster_spec(team)["authOptions"]["secretName"], "get")}
    expected |= {("", resource, head, verb) for verb, resource in forward}
    expected |= {("mlflow", resource, pod, verb) for verb, resource in forward for pod in mlflow_pods}
    grants = _member_grants()
    assert grants == expected, f"more than they need: {grants - expected}; missing: {expected - grants}"
    for where, doc, spec in ray_clusters():
        if doc["metadata"]["name"] != team["metadata"]["name"]:
            assert spec["authOptions"]["secretName"] not in {name for _, _, name, _ in grants}, where
            assert not any(name.startswith(doc["metadata"]["name"]) for _, _, name, _ in grants), where


def _login_secrets(doc: dict) -> set[str]:
    """The Secrets a Ray object's Ray containers take their MLflow login from."""
    return {container_env(container)[name]["valueFrom"]["secretKeyRef"]["name"]
            for group in groups(cluster_spec(doc)) for container in group["template"]["spec"]["containers"]
            for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}


def test_the_serving_login_and_a_jobs_writable_login_are_in_separate_secrets():
    """The RayCluster and the RayService run with the read-only serving login; a RayJob with its own Secret,
    which its header fills with the run owner's login, never the serving Secret."""
    serving = {arg: keys for verb, _, arg, keys in steps(header(DEPLOY / "kuberay" / "mlflow.yaml"))
               if verb == "create secret generic"}
    assert "nmt-mlflow-credentials" in serving
    made = re.search(r"create secret generic nmt-mlflow-credentials (.*)", header(DEPLOY / "kuberay" / "mlflow.yaml"))
    assert "--from-literal=username=serving " in made.group(1), "the Ray pods' shared login is the read-only one"
    for path, doc in objects():
        if doc["kind"] not in RAY_KINDS:
            continue
        secrets = _login_secrets(doc)
        if doc["kind"] != "RayJob":
            assert secrets == {"nmt-mlflow-credentials"}, path.name
            continue
        [own] = secrets
        assert own != "nmt-mlflow-credentials" and own.startswith(doc["metadata"]["name"]), path.name
        created = [(arg, keys, rest) for (verb, _, arg, keys), rest in zip(
            steps(header(path)), re.findall(r"kubectl .*", header(path))) if verb == "create secret generic"]
        assert [arg for arg, _, _ in created if "mlflow" in arg] == [own], f"{path.name} makes {created}"
        [(_, keys, line)] = [c for c in created if c[0] == own]
        assert keys == {"username", "password"} and "username=serving " not in line, line
