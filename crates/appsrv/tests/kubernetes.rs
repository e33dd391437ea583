//! contrib/kubernetes: the Deployment, the Service and the Containerfile of the http_hello
//! example, checked against each other and against the binary's own `--help`.
//!
//! Every `HTTP_HELLO_*` variable the Deployment sets must name an option (`[env: NAME=]` in
//! `http_hello --help`); the probes must reach `/readyz` and `/healthz` on the port the
//! server's metrics listener binds; the pod must outlive the drain delay plus the grace
//! period; the container must run as a non-root user without privileges, with resources set
//! and no ConfigMap; the image must build and run the same example as a non-root user.
//! `broken_manifests_are_caught` makes sure each of these checks can fail.

mod util;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use yaml_rust2::{Yaml, YamlLoader};

/// The example the Deployment runs, and whose name (upper-cased) prefixes its variables.
const PROGRAM: &str = "http_hello";

fn contrib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/kubernetes")
}

fn read(name: &str) -> String {
    let path = contrib().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `http_hello --help`, without any of its variables in the environment (a set variable
/// would show as `[env: NAME=VALUE]`).
fn help() -> String {
    let out = Command::new(util::example(PROGRAM))
        .arg("--help")
        .env_clear()
        .output()
        .expect("run --help");
    assert!(out.status.success(), "--help failed: {out:?}");
    String::from_utf8(out.stdout).expect("--help is UTF-8")
}

/// The problems found, one sentence each; empty when the three files agree.
#[derive(Debug, Default)]
struct Problems(Vec<String>);

impl Problems {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }

    fn add(&mut self, what: String) {
        self.0.push(what);
    }
}

/// Every YAML document of a file (`---` separated), or the parse error.
fn load(file: &str, text: &str, p: &mut Problems) -> Vec<Yaml> {
    match YamlLoader::load_from_str(text) {
        Ok(docs) if docs.is_empty() => {
            p.add(format!("{file}: no YAML document"));
            docs
        }
        Ok(docs) => docs,
        Err(e) => {
            p.add(format!("{file}: not YAML: {e}"));
            Vec::new()
        }
    }
}

/// `y["a"]["b"]...` for the path `a.b...`; `Yaml::BadValue` where a key is missing.
fn at<'a>(y: &'a Yaml, path: &str) -> &'a Yaml {
    path.split('.').fold(y, |y, key| &y[key])
}

fn text(y: &Yaml) -> Option<&str> {
    y.as_str()
}

/// A quantity (`100m`, `64Mi`, `1`) or a count: a string or a number.
fn is_set(y: &Yaml) -> bool {
    match y {
        Yaml::String(s) => !s.is_empty(),
        Yaml::Integer(_) | Yaml::Real(_) => true,
        _ => false,
    }
}

/// The paths of the keys named one of `names` anywhere under `y`.
fn find_keys(y: &Yaml, names: &[&str], here: &str, out: &mut Vec<String>) {
    match y {
        Yaml::Hash(h) => {
            for (k, v) in h {
                let key = k.as_str().unwrap_or("?");
                let path = if here.is_empty() {
                    key.to_string()
                } else {
                    format!("{here}.{key}")
                };
                if names.contains(&key) {
                    out.push(path.clone());
                }
                find_keys(v, names, &path, out);
            }
        }
        Yaml::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                find_keys(v, names, &format!("{here}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The documents of `kind`.
fn of_kind<'a>(docs: &'a [Yaml], kind: &str) -> Vec<&'a Yaml> {
    docs.iter().filter(|d| text(&d["kind"]) == Some(kind)).collect()
}

/// A container port by name, or the number itself: what a probe's or a Service's port
/// designates.
fn resolve_port(container: &Yaml, port: &Yaml) -> Option<i64> {
    match port {
        Yaml::Integer(n) => Some(*n),
        Yaml::String(name) => container["ports"]
            .as_vec()?
            .iter()
            .find(|p| text(&p["name"]) == Some(name))
            .and_then(|p| p["containerPort"].as_i64()),
        _ => None,
    }
}

/// `a ⊆ b` for label maps (a missing or empty `a` is not).
fn labels_within(a: &Yaml, b: &Yaml) -> bool {
    match (a.as_hash(), b.as_hash()) {
        (Some(a), Some(b)) => !a.is_empty() && a.iter().all(|(k, v)| b.get(k) == Some(v)),
        _ => false,
    }
}

/// Seconds as the server reads them (`5`, `0.5`).
fn seconds(env: &HashMap<String, String>, name: &str, p: &mut Problems) -> Option<f64> {
    let Some(v) = env.get(name) else {
        p.add(format!("deployment.yaml: {name} is not set"));
        return None;
    };
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Some(s),
        _ => {
            p.add(format!(
                "deployment.yaml: {name}={v:?} is not a number of seconds"
            ));
            None
        }
    }
}

/// The addresses of a listen value (`0.0.0.0:8080`, comma-separated).
fn addrs(env: &HashMap<String, String>, name: &str, p: &mut Problems) -> Vec<SocketAddr> {
    let Some(v) = env.get(name) else {
        p.add(format!("deployment.yaml: {name} is not set"));
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in v.split(',') {
        match a.trim().parse::<SocketAddr>() {
            Ok(a) if a.ip().is_loopback() => p.add(format!(
                "deployment.yaml: {name}={v}: {a} is loopback, out of reach of the kubelet and the Service"
            )),
            Ok(a) => out.push(a),
            Err(_) => p.add(format!("deployment.yaml: {name}={v}: {a:?} is not IP:PORT")),
        }
    }
    out
}

/// What the Containerfile check needs from the Deployment.
#[derive(Debug, Default)]
struct Pod {
    run_as_user: Option<i64>,
}

fn check_deployment(docs: &[Yaml], help: &str, p: &mut Problems) -> (Pod, Option<Yaml>, Option<Yaml>) {
    let mut pod = Pod::default();
    for (i, d) in docs.iter().enumerate() {
        p.check(
            text(&d["apiVersion"]).is_some() && text(&d["kind"]).is_some(),
            || format!("deployment.yaml: document {i} has no apiVersion or kind"),
        );
    }
    let deployments = of_kind(docs, "Deployment");
    if deployments.len() != 1 {
        p.add(format!(
            "deployment.yaml: {} Deployment(s), not one",
            deployments.len()
        ));
        return (pod, None, None);
    }
    let dep = deployments[0];
    p.check(text(&dep["apiVersion"]) == Some("apps/v1"), || {
        "deployment.yaml: the Deployment's apiVersion is not apps/v1".into()
    });
    p.check(of_kind(docs, "ConfigMap").is_empty(), || {
        "deployment.yaml: defines a ConfigMap (the configuration is the environment)".into()
    });
    let mut refs = Vec::new();
    for d in docs {
        find_keys(
            d,
            &["configMap", "configMapKeyRef", "configMapRef"],
            "",
            &mut refs,
        );
    }
    p.check(refs.is_empty(), || {
        format!("deployment.yaml: ConfigMap references at {refs:?} (the configuration is the environment)")
    });

    let spec = &dep["spec"];
    p.check(spec["replicas"].as_i64() == Some(2), || {
        format!("deployment.yaml: replicas is {:?}, not 2", spec["replicas"])
    });
    p.check(text(at(spec, "strategy.type")) == Some("RollingUpdate"), || {
        "deployment.yaml: strategy.type is not RollingUpdate".into()
    });
    p.check(
        at(spec, "strategy.rollingUpdate.maxUnavailable").as_i64() == Some(0),
        || {
            "deployment.yaml: strategy.rollingUpdate.maxUnavailable is not 0 (a rollout would lower capacity)"
                .into()
        },
    );
    p.check(
        at(spec, "strategy.rollingUpdate.maxSurge").as_i64() == Some(1),
        || "deployment.yaml: strategy.rollingUpdate.maxSurge is not 1".into(),
    );
    let template_labels = at(spec, "template.metadata.labels").clone();
    p.check(
        labels_within(at(spec, "selector.matchLabels"), &template_labels),
        || "deployment.yaml: selector.matchLabels are not among the template's labels".into(),
    );

    let ps = at(spec, "template.spec");
    let containers = ps["containers"].as_vec().cloned().unwrap_or_default();
    if containers.len() != 1 {
        p.add(format!(
            "deployment.yaml: {} container(s), not one",
            containers.len()
        ));
        return (pod, None, Some(template_labels));
    }
    let c = &containers[0];
    p.check(is_set(&c["image"]), || {
        "deployment.yaml: the container has no image".into()
    });
    for key in ["command", "args", "envFrom"] {
        p.check(c[key].is_badvalue(), || {
            format!(
                "deployment.yaml: the container sets {key} (the configuration is the \
                 environment, the command the image's)"
            )
        });
    }

    // The environment: plain NAME=value pairs, each naming an option of the program.
    let prefix = format!("{}_", PROGRAM.to_uppercase());
    let mut env = HashMap::new();
    for e in c["env"].as_vec().map(Vec::as_slice).unwrap_or_default() {
        let Some(name) = text(&e["name"]) else {
            p.add(format!("deployment.yaml: an env entry without a name: {e:?}"));
            continue;
        };
        p.check(e["valueFrom"].is_badvalue(), || {
            format!("deployment.yaml: {name} takes valueFrom (the values are in the manifest)")
        });
        let Some(value) = text(&e["value"]) else {
            p.add(format!(
                "deployment.yaml: {name}'s value is not a string (Kubernetes refuses it)"
            ));
            continue;
        };
        p.check(name.starts_with(&prefix), || {
            format!("deployment.yaml: {name} is not one of {PROGRAM}'s variables ({prefix}*)")
        });
        p.check(help.contains(&format!("[env: {name}=")), || {
            format!("deployment.yaml: {name} names no option: `{PROGRAM} --help` has no [env: {name}]")
        });
        if env.insert(name.to_string(), value.to_string()).is_some() {
            p.add(format!("deployment.yaml: {name} is set twice"));
        }
    }

    // Ports and probes.
    let listen = addrs(&env, &format!("{prefix}LISTEN"), p);
    let metrics = addrs(&env, &format!("{prefix}METRICS_LISTEN"), p);
    let http_port = resolve_port(c, &Yaml::String("http".into()));
    let metrics_port = resolve_port(c, &Yaml::String("metrics".into()));
    p.check(
        http_port.is_some_and(|port| listen.iter().any(|a| i64::from(a.port()) == port)),
        || {
            format!(
                "deployment.yaml: the container port named http ({http_port:?}) is not a port \
                 of {prefix}LISTEN ({listen:?})"
            )
        },
    );
    p.check(
        metrics_port.is_some() && metrics.iter().all(|a| Some(i64::from(a.port())) == metrics_port),
        || {
            format!(
                "deployment.yaml: the container port named metrics ({metrics_port:?}) is not \
                 the port of {prefix}METRICS_LISTEN ({metrics:?})"
            )
        },
    );
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = at(c, &format!("{probe}.httpGet"));
        p.check(text(&get["path"]) == Some(path), || {
            format!("deployment.yaml: {probe} asks for {:?}, not {path}", get["path"])
        });
        let port = resolve_port(c, &get["port"]);
        p.check(port.is_some() && port == metrics_port, || {
            format!(
                "deployment.yaml: {probe} asks port {:?} ({port:?}), not the metrics port ({metrics_port:?})",
                get["port"]
            )
        });
    }

    // Stopping: out of the rotation within the drain delay, gone before the SIGKILL.
    let drain = seconds(&env, &format!("{prefix}DRAIN_DELAY"), p);
    let grace = seconds(&env, &format!("{prefix}GRACE_PERIOD"), p);
    if let Some(drain) = drain {
        p.check(drain > 0.0, || {
            format!(
                "deployment.yaml: {prefix}DRAIN_DELAY is 0: the listeners close while the pod \
                 is still an endpoint"
            )
        });
        let period = c["readinessProbe"]["periodSeconds"].as_i64().unwrap_or(10);
        let failures = c["readinessProbe"]["failureThreshold"].as_i64().unwrap_or(3);
        p.check((period * failures) as f64 <= drain, || {
            format!(
                "deployment.yaml: the readiness probe sees a drain after up to {period} s x \
                 {failures}, longer than the drain delay of {drain} s"
            )
        });
    }
    let tgps = ps["terminationGracePeriodSeconds"].as_i64();
    if let (Some(drain), Some(grace)) = (drain, grace) {
        p.check(tgps.is_some_and(|t| t as f64 > drain + grace), || {
            format!(
                "deployment.yaml: terminationGracePeriodSeconds {tgps:?} is not above drain \
                 delay + grace period ({drain} + {grace} s): the kubelet's SIGKILL would cut \
                 connections still finishing"
            )
        });
    }

    // Identity and privileges: the container's securityContext, or the pod's.
    let sec = &c["securityContext"];
    let psec = &ps["securityContext"];
    let either = |key: &str| {
        if sec[key].is_badvalue() {
            psec[key].clone()
        } else {
            sec[key].clone()
        }
    };
    p.check(sec["allowPrivilegeEscalation"].as_bool() == Some(false), || {
        "deployment.yaml: allowPrivilegeEscalation is not false".into()
    });
    p.check(sec["readOnlyRootFilesystem"].as_bool() == Some(true), || {
        "deployment.yaml: readOnlyRootFilesystem is not true".into()
    });
    p.check(either("runAsNonRoot").as_bool() == Some(true), || {
        "deployment.yaml: runAsNonRoot is not true".into()
    });
    pod.run_as_user = either("runAsUser").as_i64();
    p.check(pod.run_as_user.is_some_and(|u| u > 0), || {
        format!(
            "deployment.yaml: runAsUser is {:?}, not a non-root uid",
            pod.run_as_user
        )
    });
    let drops = at(sec, "capabilities.drop").as_vec().cloned().unwrap_or_default();
    p.check(drops.iter().any(|d| text(d) == Some("ALL")), || {
        "deployment.yaml: capabilities.drop has no ALL".into()
    });
    p.check(
        text(&either("seccompProfile")["type"]) == Some("RuntimeDefault"),
        || "deployment.yaml: seccompProfile.type is not RuntimeDefault".into(),
    );
    for q in ["requests.cpu", "requests.memory", "limits.cpu", "limits.memory"] {
        p.check(is_set(at(&c["resources"], q)), || {
            format!("deployment.yaml: resources.{q} is not set")
        });
    }

    // The control socket: on a writable volume (the root file system is read-only), in a
    // directory of its own (an emptyDir is world-writable, which the server refuses).
    if let Some(control) = env.get(&format!("{prefix}CONTROL")) {
        let dir = Path::new(control).parent().unwrap_or(Path::new("/"));
        let mounts: Vec<(String, String)> = c["volumeMounts"]
            .as_vec()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|m| Some((text(&m["mountPath"])?.to_string(), text(&m["name"])?.to_string())))
            .collect();
        match mounts.iter().find(|(path, _)| dir.starts_with(path)) {
            None => p.add(format!(
                "deployment.yaml: {prefix}CONTROL={control} is on the read-only root file system"
            )),
            Some((path, _)) => p.check(Path::new(path) != dir, || {
                format!(
                    "deployment.yaml: {prefix}CONTROL={control} is directly in the volume \
                     {path}, world-writable: the server refuses it; use a subdirectory"
                )
            }),
        }
    }
    (pod, Some(c.clone()), Some(template_labels))
}

fn check_service(docs: &[Yaml], container: Option<&Yaml>, labels: Option<&Yaml>, p: &mut Problems) {
    let services = of_kind(docs, "Service");
    p.check(docs.len() == services.len(), || {
        "service.yaml: holds documents other than Services".into()
    });
    if services.len() != 1 {
        p.add(format!("service.yaml: {} Service(s), not one", services.len()));
        return;
    }
    let spec = &services[0]["spec"];
    p.check(text(&spec["type"]) == Some("ClusterIP"), || {
        "service.yaml: type is not ClusterIP".into()
    });
    if let Some(labels) = labels {
        p.check(labels_within(&spec["selector"], labels), || {
            "service.yaml: the selector does not match the Deployment's pods".into()
        });
    }
    let Some(c) = container else { return };
    let ports = spec["ports"].as_vec().cloned().unwrap_or_default();
    let target = |port: &Yaml| resolve_port(c, &port["targetPort"]).or_else(|| port["port"].as_i64());
    let http = resolve_port(c, &Yaml::String("http".into()));
    p.check(
        ports
            .iter()
            .any(|port| port["port"].as_i64() == Some(8080) && target(port) == http),
        || format!("service.yaml: no port 8080 to the container's http port ({http:?})"),
    );
    let metrics = resolve_port(c, &Yaml::String("metrics".into()));
    for port in ports.iter().filter(|port| text(&port["name"]) == Some("metrics")) {
        p.check(target(port) == metrics, || {
            format!(
                "service.yaml: the metrics port goes to {:?}, not the container's metrics port ({metrics:?})",
                target(port)
            )
        });
    }
}

/// The Containerfile's instructions, continuation lines joined, comments dropped.
fn instructions(containerfile: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in containerfile.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                let (word, rest) = current.split_once(char::is_whitespace).unwrap_or((&current, ""));
                out.push((word.to_uppercase(), rest.trim().to_string()));
                current.clear();
            }
        }
    }
    out
}

fn check_containerfile(containerfile: &str, pod: &Pod, p: &mut Problems) {
    let all = instructions(containerfile);
    let stages: Vec<usize> = (0..all.len()).filter(|&i| all[i].0 == "FROM").collect();
    if stages.len() < 2 {
        p.add("Containerfile: not multi-stage (a builder, then the image)".into());
        return;
    }
    p.check(all[stages[0]].1.contains("rust:1-bookworm"), || {
        format!(
            "Containerfile: the builder is {:?}, not rust:1-bookworm",
            all[stages[0]].1
        )
    });
    let (build, last) = all.split_at(*stages.last().unwrap());

    // The builder builds the example the Deployment runs.
    let cargo = build
        .iter()
        .filter(|(i, _)| i == "RUN")
        .find(|(_, cmd)| cmd.contains("cargo build"))
        .map(|(_, cmd)| cmd.split_whitespace().collect::<Vec<_>>());
    match cargo {
        None => p.add("Containerfile: no RUN cargo build in the builder".into()),
        Some(words) => {
            let after = |flag: &str| words.windows(2).find(|w| w[0] == flag).map(|w| w[1]);
            p.check(words.contains(&"--release"), || {
                "Containerfile: cargo build without --release".into()
            });
            p.check(after("-p") == Some("appsrv"), || {
                "Containerfile: cargo build without -p appsrv".into()
            });
            p.check(after("--example") == Some(PROGRAM), || {
                format!(
                    "Containerfile: builds the example {:?}, not {PROGRAM}, which the Deployment runs",
                    after("--example")
                )
            });
        }
    }

    // The image: the binary, run as a non-root user.
    p.check(
        last[0].1.contains("distroless/cc") || last[0].1.contains("debian:bookworm-slim"),
        || format!("Containerfile: the image is based on {:?}", last[0].1),
    );
    p.check(
        last.iter()
            .any(|(i, rest)| i == "COPY" && rest.contains("--from=") && rest.contains(PROGRAM)),
        || format!("Containerfile: the image copies no {PROGRAM} from the builder"),
    );
    let entry = last
        .iter()
        .rev()
        .find(|(i, _)| i == "ENTRYPOINT")
        .map(|(_, e)| e.as_str());
    let argv: Option<Vec<String>> = entry.and_then(|e| serde_json::from_str(e).ok());
    p.check(
        argv.as_ref()
            .and_then(|a| a.first())
            .is_some_and(|bin| Path::new(bin).file_name().and_then(|n| n.to_str()) == Some(PROGRAM)),
        || format!("Containerfile: ENTRYPOINT {entry:?} is not the {PROGRAM} binary in exec form"),
    );
    let user = last
        .iter()
        .rev()
        .find(|(i, _)| i == "USER")
        .map(|(_, u)| u.as_str());
    match user {
        None => p.add("Containerfile: the image has no USER (it would run as root)".into()),
        Some(u) => {
            let uid = u.split(':').next().unwrap_or("");
            p.check(uid != "root" && uid != "0" && !uid.is_empty(), || {
                format!("Containerfile: USER {u} is root")
            });
            if let (Ok(uid), Some(run_as)) = (uid.parse::<i64>(), pod.run_as_user) {
                p.check(uid == run_as, || {
                    format!("Containerfile: USER {u} is not the Deployment's runAsUser {run_as}")
                });
            }
        }
    }
}

/// Everything wrong with the three files, as sentences.
fn problems(deployment: &str, service: &str, containerfile: &str, help: &str) -> Vec<String> {
    let mut p = Problems::default();
    let deployment = load("deployment.yaml", deployment, &mut p);
    let service = load("service.yaml", service, &mut p);
    let (pod, container, labels) = check_deployment(&deployment, help, &mut p);
    check_service(&service, container.as_ref(), labels.as_ref(), &mut p);
    check_containerfile(containerfile, &pod, &mut p);
    p.0
}

#[test]
fn manifests_agree_with_the_binary_and_the_image() {
    let help = help();
    // The check of the variables means something only if --help shows them this way.
    assert!(help.contains("[env: HTTP_HELLO_WORKERS="), "{help}");
    let found = problems(
        &read("deployment.yaml"),
        &read("service.yaml"),
        &read("Containerfile"),
        &help,
    );
    assert!(found.is_empty(), "contrib/kubernetes:\n  {}", found.join("\n  "));
}

#[test]
fn broken_manifests_are_caught() {
    let help = help();
    let files = [
        read("deployment.yaml"),
        read("service.yaml"),
        read("Containerfile"),
    ];
    // (file, what, replaced by, a word of the problem expected)
    let breakages: &[(usize, &str, &str, &str)] = &[
        (
            0,
            "terminationGracePeriodSeconds: 40",
            "terminationGracePeriodSeconds: 25",
            "terminationGracePeriodSeconds",
        ),
        (
            0,
            "name: HTTP_HELLO_DRAIN_DELAY",
            "name: HTTP_HELLO_DRAIN_DELAYS",
            "HTTP_HELLO_DRAIN_DELAYS names no option",
        ),
        (
            0,
            "name: HTTP_HELLO_LOG_LEVEL",
            "name: LOG_LEVEL",
            "LOG_LEVEL is not one of",
        ),
        (
            0,
            "allowPrivilegeEscalation: false",
            "allowPrivilegeEscalation: true",
            "allowPrivilegeEscalation",
        ),
        (0, "runAsNonRoot: true", "runAsNonRoot: false", "runAsNonRoot"),
        (
            0,
            "readOnlyRootFilesystem: true",
            "readOnlyRootFilesystem: false",
            "readOnlyRootFilesystem",
        ),
        (0, "path: /readyz", "path: /ready", "readinessProbe asks for"),
        (0, "port: metrics", "port: http", "not the metrics port"),
        (
            0,
            "value: \"0.0.0.0:9100\"",
            "value: \"0.0.0.0:9101\"",
            "METRICS_LISTEN",
        ),
        (
            0,
            "value: \"0.0.0.0:8080\"",
            "value: \"127.0.0.1:8080\"",
            "loopback",
        ),
        (
            0,
            "periodSeconds: 2\n",
            "periodSeconds: 10\n",
            "readiness probe sees a drain",
        ),
        (0, "limits:", "limitz:", "resources.limits.cpu"),
        (0, "maxUnavailable: 0", "maxUnavailable: 1", "maxUnavailable"),
        (
            0,
            "emptyDir:\n            medium: Memory",
            "configMap:\n            name: http-hello",
            "ConfigMap",
        ),
        (
            0,
            "/run/appsrv/http_hello/ctl.sock",
            "/run/appsrv/ctl.sock",
            "world-writable",
        ),
        (0, "value: \"2\"", "value: 2", "not a string"),
        (0, "  replicas: 2", "  replicas: [", "not YAML"),
        (1, "targetPort: http", "targetPort: 8081", "no port 8080"),
        (1, "type: ClusterIP", "type: NodePort", "ClusterIP"),
        (2, "--example http_hello", "--example hello", "not http_hello"),
        (2, "USER 65532:65532", "USER root", "is root"),
        (2, "USER 65532:65532", "USER 1000", "runAsUser"),
        (
            2,
            "ENTRYPOINT [\"/usr/local/bin/http_hello\"]",
            "ENTRYPOINT /usr/local/bin/http_hello",
            "exec form",
        ),
    ];
    for &(file, from, to, expected) in breakages {
        assert!(
            files[file].contains(from),
            "file {file} no longer has {from:?}: update this test"
        );
        let mut broken = files.clone();
        broken[file] = broken[file].replace(from, to);
        let found = problems(&broken[0], &broken[1], &broken[2], &help);
        assert!(
            found.iter().any(|p| p.contains(expected)),
            "{from:?} -> {to:?} should be reported as {expected:?}; found {found:?}"
        );
    }
}
