// A double of NVIDIA's go-nvfm Fabric Manager bindings, written for this project (tests/go_nvfm_double/README.md):
// scripts/build-nvidia-dra-driver.sh replaces github.com/NVIDIA/go-nvfm with it to build NVIDIA's DRA driver.
module github.com/NVIDIA/go-nvfm

go 1.22
