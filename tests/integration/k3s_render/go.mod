module gpuops.k8s/tests/k3srender

go 1.21
