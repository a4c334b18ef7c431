#!/bin/sh
# A stand-in for kubeadm's control-plane images, for a test that runs kubeadm's own static pod
# manifests: installed as etcd, kube-apiserver, kube-controller-manager and kube-scheduler, it
# takes the command line kubeadm writes, reports what the pod gave it, and answers its probes
# where the real component would: HTTPS (openssl s_server) on the component's secure port with
# the certificate its flags name, or one it makes as the real components do without one; plain
# HTTP (busybox httpd) on etcd's metrics URL.
#
# It prints one `name: value` line per observation, then serves until stopped:
#   command: the command line, as received
#   seccomp: the Seccomp mode from /proc/self/status (2 is a filter: RuntimeDefault)
#   oom_score_adj: the container's OOM score adjustment
#   cpu.shares: its cgroup's CPU shares (from its CPU request)
#   cgroup: its cpu cgroup path (the QoS class's cgroup is in it)
#   writable DIR: yes or no, for the directories of its volumes
#   file PATH: present or missing, for each file its flags name
set -u

name=$(basename "$0")
echo "command: $name $*"
echo "seccomp: $(sed -n 's/^Seccomp:[[:space:]]*//p' /proc/self/status)"
echo "oom_score_adj: $(cat /proc/self/oom_score_adj)"
echo "cpu.shares: $(cat /sys/fs/cgroup/cpu/cpu.shares 2>/dev/null || cat /sys/fs/cgroup/cpu,cpuacct/cpu.shares)"
echo "cgroup: $(grep -E ':cpu(,cpuacct)?:|:cpu,cpuacct:' /proc/self/cgroup | head -n1 | cut -d: -f3)"

flag() {
    for arg in $ARGS; do
        case "$arg" in --"$1"=*) echo "${arg#*=}"; return ;; esac
    done
}
ARGS="$*"

writable() {
    if touch "$1/.stand-in-write-check" 2>/dev/null; then
        rm -f "$1/.stand-in-write-check"
        echo "writable $1: yes"
    else
        echo "writable $1: no"
    fi
}

# Every file a flag names, as the real component would open it.
for arg in $ARGS; do
    value=${arg#*=}
    case "$value" in /*)
        if [ -f "$value" ]; then echo "file $value: present"; else echo "file $value: missing"; fi
    esac
done

# A self-signed serving certificate, as kube-controller-manager and kube-scheduler make one
# when their flags name none.
self_signed() {
    printf '[req]\ndistinguished_name = dn\n[dn]\n' > /tmp/openssl.cnf
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=$name" -config /tmp/openssl.cnf \
        -keyout /tmp/serving.key -out /tmp/serving.crt 2>/dev/null
}

# Runs the server until SIGTERM, which stops it, as the real components stop on it (the shell,
# the container's first process, would otherwise not hear it and wait for the grace period's end).
serve() {
    "$@" &
    server=$!
    trap 'kill "$server"; exit 0' TERM
    wait "$server"
}

serve_https() {
    port=$1 cert=$2 key=$3
    echo "serving: https on $port"
    serve openssl s_server -www -accept "$port" -cert "$cert" -key "$key"
}

case "$name" in
    etcd)
        data=$(flag data-dir)
        writable "$data"
        echo "written by the stand-in etcd" > "$data/stand-in-etcd"
        writable "$(dirname "$(flag cert-file)")"
        metrics=$(flag listen-metrics-urls)
        address=${metrics#http://}
        mkdir -p /tmp/www
        echo '{"health":"true","reason":""}' > /tmp/www/health
        echo "serving: http on $address"
        serve httpd -f -vv -p "$address" -h /tmp/www
        ;;
    kube-apiserver)
        writable "$(dirname "$(flag tls-cert-file)")"
        writable /etc/ssl/certs
        serve_https "$(flag secure-port)" "$(flag tls-cert-file)" "$(flag tls-private-key-file)"
        ;;
    kube-controller-manager)
        writable "$(dirname "$(flag client-ca-file)")"
        writable /usr/libexec/kubernetes/kubelet-plugins/volume/exec
        self_signed
        serve_https 10257 /tmp/serving.crt /tmp/serving.key
        ;;
    kube-scheduler)
        self_signed
        serve_https 10259 /tmp/serving.crt /tmp/serving.key
        ;;
    *)
        echo "unknown component $name" >&2
        exit 2
        ;;
esac
