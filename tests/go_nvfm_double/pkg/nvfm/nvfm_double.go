// Package nvfm is a double of NVIDIA's go-nvfm bindings (github.com/NVIDIA/go-nvfm/pkg/nvfm), written for this
// project: it has the identifiers NVIDIA's DRA driver uses, and every call answers ERROR_NOT_SUPPORTED. It links
// no library and talks to no Fabric Manager. See ../../README.md.
package nvfm

// Return is a call's result. The values are the double's own, not Fabric Manager's.
type Return int32

const (
	// SUCCESS is what no call of the double returns.
	SUCCESS Return = 0
	// ERROR_NOT_SUPPORTED is what every call of the double returns.
	ERROR_NOT_SUPPORTED Return = -1
)

func (r Return) String() string {
	switch r {
	case SUCCESS:
		return "success (go-nvfm double)"
	case ERROR_NOT_SUPPORTED:
		return "not supported: this build links a go-nvfm double, not Fabric Manager"
	}
	return "unknown return (go-nvfm double)"
}

// FabricPartitionId identifies a fabric partition.
type FabricPartitionId uint32

// FabricPartitionGpuInfo is one GPU of a partition. The array lengths are the double's choice.
type FabricPartitionGpuInfo struct {
	PhysicalId          uint32
	Uuid                [80]int8
	PciBusId            [32]int8
	NumNvLinksAvailable uint32
	MaxNumNvLinks       uint32
	NvlinkLineRateMBps  uint32
}

// FabricPartitionInfo is one partition.
type FabricPartitionInfo struct {
	PartitionId FabricPartitionId
	IsActive    uint32
	NumGpus     uint32
	GpuInfo     [8]FabricPartitionGpuInfo
}

// FabricPartitionList is the partitions Fabric Manager supports; the double's is always empty.
type FabricPartitionList struct {
	NumPartitions uint32
	PartitionInfo [64]FabricPartitionInfo
}

// Handle is a connection.
type Handle interface {
	Disconnect() Return
	GetSupportedFabricPartitions() (FabricPartitionList, Return)
	ActivateFabricPartition(FabricPartitionId) Return
	DeactivateFabricPartition(FabricPartitionId) Return
}

// Interface is the library.
type Interface interface {
	Init() Return
	Shutdown() Return
	Connect(...ConnectOption) (Handle, Return)
}

type libraryOptions struct{ path string }

// LibraryOption configures New.
type LibraryOption func(*libraryOptions)

// WithLibraryPath records a library path, which the double never opens.
func WithLibraryPath(path string) LibraryOption {
	return func(o *libraryOptions) { o.path = path }
}

type connectOptions struct {
	address    string
	unixSocket bool
	timeoutMs  uint32
}

// ConnectOption configures Connect.
type ConnectOption func(*connectOptions)

// WithAddress records a TCP address, which the double never dials.
func WithAddress(address string) ConnectOption {
	return func(o *connectOptions) { o.address, o.unixSocket = address, false }
}

// WithUnixSocket records a socket path, which the double never dials.
func WithUnixSocket(path string) ConnectOption {
	return func(o *connectOptions) { o.address, o.unixSocket = path, true }
}

// WithTimeoutMs records a connect timeout.
func WithTimeoutMs(timeoutMs uint32) ConnectOption {
	return func(o *connectOptions) { o.timeoutMs = timeoutMs }
}

type library struct{ options libraryOptions }

// New returns the double's library: every call answers ERROR_NOT_SUPPORTED.
func New(opts ...LibraryOption) Interface {
	l := &library{}
	for _, opt := range opts {
		opt(&l.options)
	}
	return l
}

func (*library) Init() Return     { return ERROR_NOT_SUPPORTED }
func (*library) Shutdown() Return { return ERROR_NOT_SUPPORTED }

func (*library) Connect(opts ...ConnectOption) (Handle, Return) {
	o := connectOptions{}
	for _, opt := range opts {
		opt(&o)
	}
	return handle{}, ERROR_NOT_SUPPORTED
}

type handle struct{}

func (handle) Disconnect() Return { return ERROR_NOT_SUPPORTED }

func (handle) GetSupportedFabricPartitions() (FabricPartitionList, Return) {
	return FabricPartitionList{}, ERROR_NOT_SUPPORTED
}

func (handle) ActivateFabricPartition(FabricPartitionId) Return   { return ERROR_NOT_SUPPORTED }
func (handle) DeactivateFabricPartition(FabricPartitionId) Return { return ERROR_NOT_SUPPORTED }
