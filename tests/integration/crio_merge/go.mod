module gpuops.test/crio-merge

go 1.22

require github.com/BurntSushi/toml v1.6.0
