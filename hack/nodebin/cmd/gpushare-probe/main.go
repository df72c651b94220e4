// Command gpushare-probe is the entrypoint of the node harness's images
// (gpushare.test/probe:1, cuda:1, cuda-legacy:1). It prints one JSON line saying
// what the container was given: its environment, the GPU device nodes under /dev
// and whether each opens, the content of /etc/ld.so.preload and its mount points.
// The runtime, the NVIDIA toolkit and the device plugins decide them; the tests read
// them back.
//
// Arguments, each at most once:
//
//	region  first create the file CUDA_DEVICE_MEMORY_SHARED_CACHE names, as
//	        HAMi-core does when it starts (O_CREAT, mode 0666)
//	sleep   after printing, sleep until killed (a pod that stays Running)
//	(none)  print and exit 0
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
)

type report struct {
	Env     map[string]string `json:"env"`
	Devices []string          `json:"devices"`
	// What opening each device node read-write gives: "ok", or the errno's name. The
	// node's cards have no driver, so one the device cgroup lets through gives ENXIO;
	// one it refuses gives EPERM.
	Access  map[string]string `json:"access"`
	Preload *string           `json:"preload"`
	Mounts  []string          `json:"mounts"`
	// The mount points mounted read-only (per-mount option ro), beside the four.
	ReadOnly []string `json:"readOnly"`
	Region   *string  `json:"region,omitempty"`
}

func environment() map[string]string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		env[name] = value
	}
	return env
}

// devices lists /dev/nvidia* (the directory nvidia-caps too, and what is in it),
// /dev/dri/* and the nvidia* nodes one directory down (a host directory mounted
// under /dev), as paths.
func devices() []string {
	found := []string{}
	for _, pattern := range []string{"/dev/nvidia*", "/dev/*/nvidia*", "/dev/dri/*"} {
		matches, _ := filepath.Glob(pattern)
		found = append(found, matches...)
	}
	sort.Strings(found)
	return slices.Compact(found)
}

var errnoNames = map[syscall.Errno]string{
	syscall.EPERM: "EPERM", syscall.EACCES: "EACCES", syscall.ENXIO: "ENXIO",
	syscall.ENODEV: "ENODEV", syscall.ENOENT: "ENOENT",
}

// access opens each character device of paths read-write, as CUDA opens a card,
// and closes it again.
func access(paths []string) map[string]string {
	opened := map[string]string{}
	for _, path := range paths {
		info, err := os.Stat(path)
		if err != nil || info.Mode()&os.ModeCharDevice == 0 {
			continue
		}
		file, err := os.OpenFile(path, os.O_RDWR|syscall.O_NONBLOCK, 0)
		if err == nil {
			file.Close()
			opened[path] = "ok"
			continue
		}
		var errno syscall.Errno
		if errors.As(err, &errno) && errnoNames[errno] != "" {
			opened[path] = errnoNames[errno]
		} else {
			opened[path] = err.Error()
		}
	}
	return opened
}

func preload() *string {
	data, err := os.ReadFile("/etc/ld.so.preload")
	if err != nil {
		return nil
	}
	text := string(data)
	return &text
}

// mounts reads the mount points (field 5) of /proc/self/mountinfo, octal escapes
// undone as the kernel writes them (\040 for a space), and those of them whose
// per-mount options (field 6) say ro.
func mounts() (points []string, readOnly []string) {
	points, readOnly = []string{}, []string{}
	file, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return points, readOnly
	}
	defer file.Close()
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) > 5 {
			point := unescape(fields[4])
			points = append(points, point)
			for _, option := range strings.Split(fields[5], ",") {
				if option == "ro" {
					readOnly = append(readOnly, point)
				}
			}
		}
	}
	return points, readOnly
}

func unescape(field string) string {
	var out strings.Builder
	for i := 0; i < len(field); i++ {
		if field[i] == '\\' && i+3 < len(field) {
			var code int
			if _, err := fmt.Sscanf(field[i+1:i+4], "%03o", &code); err == nil {
				out.WriteByte(byte(code))
				i += 3
				continue
			}
		}
		out.WriteByte(field[i])
	}
	return out.String()
}

// region creates the shared region file where HAMi-core would: the path
// CUDA_DEVICE_MEMORY_SHARED_CACHE names, else HAMi-core's default.
func region() string {
	path := os.Getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE")
	if path == "" {
		path = "/tmp/cudevshr.cache"
	}
	file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return "error: " + err.Error()
	}
	file.Close()
	return path
}

func main() {
	modes := map[string]bool{}
	for _, arg := range os.Args[1:] {
		if arg != "sleep" && arg != "region" || modes[arg] {
			fmt.Fprintln(os.Stderr, "usage: gpushare-probe [region] [sleep]")
			os.Exit(2)
		}
		modes[arg] = true
	}
	points, readOnly := mounts()
	found := devices()
	out := report{Env: environment(), Devices: found, Access: access(found), Preload: preload(), Mounts: points, ReadOnly: readOnly}
	if modes["region"] {
		created := region()
		out.Region = &created
	}
	line, err := json.Marshal(out)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(string(line))
	if modes["sleep"] {
		// As PID 1 no default action applies: stop on SIGTERM ourselves.
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
	}
}
