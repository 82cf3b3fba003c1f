// simcuda: a workload that uses the simulated GPU as a CUDA program uses a GPU
// (docs/real-node.md, "The simulated GPU"). It runs in a pod on the real node,
// opens a context on a device of the simulated driver (vramguard-agent
// simgpu-driver, agent/vramguard_agent/simdriver.py) through its Unix socket, which
// the pod mounts from the host, and then asks for the device memory its
// schedule wants: BYTES... are the bytes wanted at t = 0, EVERY, 2*EVERY, ...;
// after the last one it holds that much until SIGTERM or SIGINT (exit 0).
//
// An allocation the driver refuses ends the process as a framework ends on
// "CUDA out of memory": the message on stderr (PyTorch's wording) and exit
// status 1. The driver frees everything the process held when its connection
// closes, however it ends (exit, SIGKILL, OOM).
//
// Usage: simcuda [--socket PATH] [--device N] [--every DURATION] [--host-bytes N] BYTES...
// Sizes are bytes or quantities (512Mi, 2Gi); --device defaults to the first
// entry of CUDA_VISIBLE_DEVICES, else 0.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type reply struct {
	OK        bool   `json:"ok"`
	Error     string `json:"error"`
	UUID      string `json:"uuid"`
	Name      string `json:"name"`
	Total     int64  `json:"totalBytes"`
	Free      int64  `json:"freeBytes"`
	Held      int64  `json:"heldBytes"`
	Requested int64  `json:"requestedBytes"`
}

var units = map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 1e3, "M": 1e6, "G": 1e9}

func parseBytes(s string) (int64, error) {
	for suffix, mult := range units {
		if strings.HasSuffix(s, suffix) {
			n, err := strconv.ParseFloat(strings.TrimSuffix(s, suffix), 64)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("bad size %q", s)
			}
			return int64(n * float64(mult)), nil
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad size %q (want bytes or a quantity such as 512Mi)", s)
	}
	return n, nil
}

// mib formats bytes as PyTorch's OOM message does (two decimals, MiB or GiB).
func mib(b int64) string {
	if b >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
}

type driver struct {
	conn net.Conn
	in   *bufio.Reader
}

func (d *driver) call(req map[string]any) reply {
	line, _ := json.Marshal(req)
	if _, err := d.conn.Write(append(line, '\n')); err != nil {
		fail(3, "CUDA error: the simulated driver went away (%v)", err)
	}
	text, err := d.in.ReadBytes('\n')
	if err != nil {
		fail(3, "CUDA error: the simulated driver went away (%v)", err)
	}
	var r reply
	if err := json.Unmarshal(text, &r); err != nil {
		fail(3, "CUDA error: unreadable answer from the simulated driver: %q", text)
	}
	return r
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(code)
}

func defaultDevice() int {
	first := strings.Split(os.Getenv("CUDA_VISIBLE_DEVICES"), ",")[0]
	if n, err := strconv.Atoi(first); err == nil {
		return n
	}
	return 0
}

// holdHostMemory allocates n bytes of host RAM and touches every page, so that
// they count in the container's working set.
func holdHostMemory(n int64) []byte {
	buf := make([]byte, n)
	for i := int64(0); i < n; i += 4096 {
		buf[i] = 1
	}
	return buf
}

func main() {
	socket := flag.String("socket", "/run/simgpu/driver.sock", "the simulated driver's socket")
	device := flag.Int("device", defaultDevice(), "device index")
	every := flag.Duration("every", time.Second, "time between two sizes of the schedule")
	hostBytes := flag.String("host-bytes", "0", "host RAM to allocate and hold (bytes or a quantity)")
	flag.Parse()
	var schedule []int64
	for _, arg := range flag.Args() {
		n, err := parseBytes(arg)
		if err != nil {
			fail(2, "simcuda: %v", err)
		}
		schedule = append(schedule, n)
	}
	if len(schedule) == 0 {
		fail(2, "simcuda: want at least one size (BYTES...)")
	}
	ram, err := parseBytes(*hostBytes)
	if err != nil {
		fail(2, "simcuda: --host-bytes: %v", err)
	}
	held := holdHostMemory(ram)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	conn, err := net.Dial("unix", *socket)
	if err != nil {
		fail(3, "CUDA error: no CUDA-capable device is detected (simulated driver at %s: %v)", *socket, err)
	}
	d := &driver{conn, bufio.NewReader(conn)}
	r := d.call(map[string]any{"op": "open", "device": *device})
	if !r.OK {
		fail(3, "CUDA error: cannot open device %d: %s", *device, r.Error)
	}
	fmt.Printf("simcuda: context on GPU %d %s (%s, %s)\n", *device, r.UUID, r.Name, mib(r.Total))

	tick := time.NewTicker(*every)
	defer tick.Stop()
	for i := 0; ; i++ {
		if i < len(schedule) {
			r = d.call(map[string]any{"op": "resize", "bytes": schedule[i]})
			if !r.OK {
				fail(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %s. GPU %d has a total "+
					"capacity of %s of which %s is free. Process has %s memory in use. (%s)",
					mib(r.Requested), *device, mib(r.Total), mib(r.Free), mib(r.Held), r.Error)
			}
			fmt.Printf("simcuda: t=%s holding %s on GPU %d (%s free)\n", time.Duration(i)*(*every), mib(r.Held), *device, mib(r.Free))
		}
		select {
		case sig := <-stop:
			fmt.Printf("simcuda: %v: freeing %s and exiting\n", sig, mib(r.Held))
			conn.Close()
			runtime.KeepAlive(held)
			os.Exit(0)
		case <-tick.C:
		}
	}
}
