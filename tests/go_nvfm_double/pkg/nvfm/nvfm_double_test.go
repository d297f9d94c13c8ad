package nvfm

import "testing"

// Every call of the double answers ERROR_NOT_SUPPORTED, so a driver built with it never believes a Fabric
// Manager partition exists or was (de)activated.
func TestEveryCallAnswersNotSupported(t *testing.T) {
	lib := New(WithLibraryPath("/nonexistent/libnvfm.so"))
	if ret := lib.Init(); ret != ERROR_NOT_SUPPORTED {
		t.Errorf("Init: %v", ret)
	}
	handle, ret := lib.Connect(WithUnixSocket("/nonexistent.sock"), WithAddress("127.0.0.1:1"), WithTimeoutMs(1))
	if ret != ERROR_NOT_SUPPORTED || handle == nil {
		t.Fatalf("Connect: %v, %v", handle, ret)
	}
	list, ret := handle.GetSupportedFabricPartitions()
	if ret != ERROR_NOT_SUPPORTED || list.NumPartitions != 0 {
		t.Errorf("GetSupportedFabricPartitions: %d partitions, %v", list.NumPartitions, ret)
	}
	for name, ret := range map[string]Return{
		"ActivateFabricPartition":   handle.ActivateFabricPartition(1),
		"DeactivateFabricPartition": handle.DeactivateFabricPartition(1),
		"Disconnect":                handle.Disconnect(),
		"Shutdown":                  lib.Shutdown(),
	} {
		if ret != ERROR_NOT_SUPPORTED {
			t.Errorf("%s: %v", name, ret)
		}
	}
	if ERROR_NOT_SUPPORTED.String() == SUCCESS.String() {
		t.Errorf("the two returns read the same: %q", SUCCESS.String())
	}
}
