// Command gpushare-device-plugin stands in, on the loopback node, for the device
// plugin that serves nvidia.com/gpu on a GPU node: HAMi's (-flavour hami) or
// NVIDIA's k8s-device-plugin (-flavour nvidia). No driver or NVML runs here, so the
// devices are the fake cards of the node's static CDI spec. What matters to the
// tests is the Allocate answer, which the real kubelet, containerd and NVIDIA
// container runtime consume: it is the upstream answer, field for field, each
// cited below to its source line at a commit:
//
//	HAMi      Project-HAMi/HAMi @ 4707fb02c91c545bc7343ce26dba4c32919f9a3e
//	NVIDIA    NVIDIA/k8s-device-plugin @ 1b826acc6af3079d8923bac395c3124b8861a9a6
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	// NVIDIA internal/plugin/server.go:46-48 (HAMi server.go:74-78 has the same).
	deviceListEnvVar                          = "NVIDIA_VISIBLE_DEVICES"
	deviceListAsVolumeMountsHostPath          = "/dev/null"
	deviceListAsVolumeMountsContainerPathRoot = "/var/run/nvidia-container-devices"

	// HAMi pkg/util/types.go:21-27 and pkg/device/nvidia/device.go:167.
	assignedNodeAnnotation = "hami.io/vgpu-node"
	bindPhaseAnnotation    = "hami.io/bind-phase"
	bindTimeAnnotation     = "hami.io/bind-time"
	bindAllocating         = "allocating"
	bindSuccess            = "success"
	bindFailed             = "failed"
	devicesToAllocate      = "hami.io/vgpu-devices-to-allocate"
)

type options struct {
	flavour    string
	strategy   string
	resource   string
	gpus       int
	replicas   int
	socketDir  string
	kubeconfig string
	nodeName   string
	hookPath   string
	mpsPipe    string
	memory     int64
}

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	opts   options
	client kubernetes.Interface
	mu     sync.Mutex
}

// UUIDOf names fake card i as the node's CDI spec does (hack/nodebin writes both).
func UUIDOf(i int) string {
	return fmt.Sprintf("GPU-00000000-0000-0000-0000-00000000000%d", i)
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch advertises each card once per replica, as annotated IDs
// "<uuid>::<n>" (NVIDIA internal/rm/rm.go AnnotatedID; HAMi advertises its
// deviceSplitCount replicas the same way).
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	var devices []*pluginapi.Device
	for i := 0; i < p.opts.gpus; i++ {
		for r := 0; r < p.opts.replicas; r++ {
			id := UUIDOf(i)
			if p.opts.replicas > 1 {
				id = fmt.Sprintf("%s::%d", id, r)
			}
			devices = append(devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
		}
	}
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// uniqueUUIDs drops the replica suffix and duplicates (NVIDIA server.go:456-474,
// uniqueDeviceIDsFromAnnotatedDeviceIDs with the uuid device ID strategy).
func uniqueUUIDs(ids []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, id := range ids {
		id, _, _ = strings.Cut(id, "::")
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// deviceListResponse is getAllocateResponse's non-CDI part (NVIDIA server.go:322-366,
// HAMi server.go:914-952): the envvar strategy sets NVIDIA_VISIBLE_DEVICES to the
// IDs (NVIDIA server.go:481-483); the volume-mounts strategy sets it to the mount
// root and mounts /dev/null at <root>/<id> for each (server.go:497-506).
func (p *plugin) deviceListResponse(uuids []string) *pluginapi.ContainerAllocateResponse {
	response := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	switch p.opts.strategy {
	case "envvar":
		response.Envs[deviceListEnvVar] = strings.Join(uuids, ",")
	case "volume-mounts":
		response.Envs[deviceListEnvVar] = deviceListAsVolumeMountsContainerPathRoot
		for _, id := range uuids {
			response.Mounts = append(response.Mounts, &pluginapi.Mount{
				HostPath:      deviceListAsVolumeMountsHostPath,
				ContainerPath: filepath.Join(deviceListAsVolumeMountsContainerPathRoot, id),
			})
		}
	}
	return response
}

func (p *plugin) Allocate(ctx context.Context, reqs *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p.mu.Lock() // HAMi server.go:751: one Allocate at a time, node-wide
	defer p.mu.Unlock()
	if p.opts.flavour == "nvidia" {
		return p.allocateNvidia(reqs), nil
	}
	return p.allocateHami(ctx, reqs)
}

// allocateNvidia is NVIDIA server.go:306-320 and getAllocateResponse (322-366): the
// device list, and with MPS the pipe directory env and mounts (mps.go:74-91). The
// daemon's pipe directory is per resource under the container root /mps, the host's
// under the plugin's --mps-root, and /dev/shm is the host root's shm
// (cmd/mps-control-daemon/mps/root.go:26,40-48, daemon.go:191-197).
func (p *plugin) allocateNvidia(reqs *pluginapi.AllocateRequest) *pluginapi.AllocateResponse {
	responses := &pluginapi.AllocateResponse{}
	for _, req := range reqs.ContainerRequests {
		response := p.deviceListResponse(uniqueUUIDs(req.DevicesIds))
		if p.opts.mpsPipe != "" {
			pipe := filepath.Join("/mps", p.opts.resource, "pipe")
			response.Envs["CUDA_MPS_PIPE_DIRECTORY"] = pipe
			response.Mounts = append(response.Mounts,
				&pluginapi.Mount{ContainerPath: pipe, HostPath: filepath.Join(p.opts.mpsPipe, p.opts.resource, "pipe")},
				&pluginapi.Mount{ContainerPath: "/dev/shm", HostPath: filepath.Join(p.opts.mpsPipe, "shm")},
			)
		}
		responses.ContainerResponses = append(responses.ContainerResponses, response)
	}
	return responses
}

// pendingPod is HAMi pkg/util/util.go:76-118 (GetPendingPod, without the node lock,
// which only the scheduler extender stand-in would take): the Pending pod on this
// node with bind-time, bind-phase allocating or success, and vgpu-node = this node.
func (p *plugin) pendingPod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := p.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + p.opts.nodeName})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Status.Phase != corev1.PodPending {
			continue
		}
		if _, ok := pod.Annotations[bindTimeAnnotation]; !ok {
			continue
		}
		if phase := pod.Annotations[bindPhaseAnnotation]; phase != bindAllocating && phase != bindSuccess {
			continue
		}
		if pod.Annotations[assignedNodeAnnotation] == p.opts.nodeName {
			return pod, nil
		}
	}
	return nil, fmt.Errorf("no binding pod found on node %s", p.opts.nodeName)
}

// containerDevice is one entry of HAMi's allocation annotation
// "<uuid>,<type>,<usedmem>,<usedcores>" (pkg/device/devices.go:451-458).
type containerDevice struct {
	UUID      string
	Type      string
	Usedmem   int64
	Usedcores int64
}

// decodePod splits the annotation per container (";", init containers first) and per
// device (":"), as DecodePodDevices and DecodeContainerDevices do (devices.go:489-).
func decodePod(value string) ([][]containerDevice, error) {
	var pod [][]containerDevice
	containers := strings.Split(value, ";")
	if len(containers) > 0 && containers[len(containers)-1] == "" {
		containers = containers[:len(containers)-1]
	}
	for _, ctr := range containers {
		var devices []containerDevice
		for _, dev := range strings.Split(ctr, ":") {
			if dev == "" {
				continue
			}
			fields := strings.Split(dev, ",")
			if len(fields) < 4 {
				return nil, fmt.Errorf("malformed device %q", dev)
			}
			mem, err := strconv.ParseInt(fields[2], 10, 32)
			if err != nil {
				return nil, err
			}
			cores, err := strconv.ParseInt(fields[3], 10, 32)
			if err != nil {
				return nil, err
			}
			devices = append(devices, containerDevice{fields[0], fields[1], mem, cores})
		}
		pod = append(pod, devices)
	}
	return pod, nil
}

func encodePod(pod [][]containerDevice) string {
	var out strings.Builder
	for _, ctr := range pod {
		for _, d := range ctr {
			fmt.Fprintf(&out, "%s,%s,%d,%d:", d.UUID, d.Type, d.Usedmem, d.Usedcores)
		}
		out.WriteString(";")
	}
	return out.String()
}

func (p *plugin) patchAnnotations(ctx context.Context, pod *corev1.Pod, annotations map[string]string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	_, err = p.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// allocateHami is HAMi server.go:747-912 for a card that is not MIG.
func (p *plugin) allocateHami(ctx context.Context, reqs *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	current, err := p.pendingPod(ctx)
	if err != nil {
		return &pluginapi.AllocateResponse{}, err
	}
	podDevices, err := decodePod(current.Annotations[devicesToAllocate])
	if err != nil {
		p.failed(ctx, current)
		return &pluginapi.AllocateResponse{}, err
	}
	responses := &pluginapi.AllocateResponse{}
	for idx := range reqs.ContainerRequests {
		// popNextContainerDevices (plugin/util.go:112-131): the first container with
		// devices left, init containers first.
		var ctr *corev1.Container
		var devreq []containerDevice
		for i, devices := range podDevices {
			if len(devices) == 0 {
				continue
			}
			podDevices[i] = nil
			devreq = devices
			if i < len(current.Spec.InitContainers) {
				ctr = &current.Spec.InitContainers[i]
			} else if j := i - len(current.Spec.InitContainers); j < len(current.Spec.Containers) {
				ctr = &current.Spec.Containers[j]
			}
			break
		}
		if ctr == nil {
			p.failed(ctx, current)
			return &pluginapi.AllocateResponse{}, fmt.Errorf("no pending device allocation found")
		}
		if len(devreq) != len(reqs.ContainerRequests[idx].DevicesIds) { // server.go:802-805
			p.failed(ctx, current)
			return &pluginapi.AllocateResponse{}, fmt.Errorf("device number not matched")
		}
		uuids := make([]string, 0, len(devreq))
		for _, d := range devreq {
			uuids = append(uuids, d.UUID)
		}
		response := p.deviceListResponse(uuids) // server.go:826
		for i, dev := range devreq {            // server.go:833-838
			response.Envs[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%v", i)] = fmt.Sprintf("%vm", dev.Usedmem)
		}
		response.Envs["CUDA_DEVICE_SM_LIMIT"] = fmt.Sprint(devreq[0].Usedcores)
		response.Envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = fmt.Sprintf("%s/vgpu/%v.cache", p.opts.hookPath, uuid.New().String())
		// server.go:839-847: CUDA_OVERSUBSCRIBE, LIBCUDA_LOG_LEVEL and the core-limit
		// switch come from scheduler settings whose chart defaults leave them unset.
		cacheDir := fmt.Sprintf("%s/vgpu/containers/%s_%s", p.opts.hookPath, current.UID, ctr.Name) // server.go:848-854
		os.RemoveAll(cacheDir)
		os.MkdirAll(cacheDir, 0o777)
		os.Chmod(cacheDir, 0o777)
		os.MkdirAll("/tmp/vgpulock", 0o777)
		os.Chmod("/tmp/vgpulock", 0o777)
		response.Mounts = append(response.Mounts, // server.go:855-865
			&pluginapi.Mount{ContainerPath: fmt.Sprintf("%s/vgpu/libvgpu.so", p.opts.hookPath), HostPath: p.libPath(), ReadOnly: true},
			&pluginapi.Mount{ContainerPath: fmt.Sprintf("%s/vgpu", p.opts.hookPath), HostPath: cacheDir, ReadOnly: false},
			&pluginapi.Mount{ContainerPath: "/tmp/vgpulock", HostPath: "/tmp/vgpulock", ReadOnly: false},
		)
		found := false // server.go:866-884: the pod spec's CUDA_DISABLE_CONTROL alone
		for _, val := range ctr.Env {
			if val.Name == "CUDA_DISABLE_CONTROL" {
				if t, _ := strconv.ParseBool(val.Value); !t {
					continue
				}
				found = true
				break
			}
		}
		if !found {
			response.Mounts = append(response.Mounts, &pluginapi.Mount{ContainerPath: "/etc/ld.so.preload",
				HostPath: p.opts.hookPath + "/vgpu/ld.so.preload", ReadOnly: true})
		}
		if _, err := os.Stat(fmt.Sprintf("%s/vgpu/license", p.opts.hookPath)); err == nil { // server.go:885-897
			response.Mounts = append(response.Mounts,
				&pluginapi.Mount{ContainerPath: "/tmp/license", HostPath: fmt.Sprintf("%s/vgpu/license", p.opts.hookPath), ReadOnly: true},
				&pluginapi.Mount{ContainerPath: "/usr/bin/vgpuvalidator", HostPath: fmt.Sprintf("%s/vgpu/vgpuvalidator", p.opts.hookPath), ReadOnly: true},
			)
		}
		responses.ContainerResponses = append(responses.ContainerResponses, response)
	}
	// server.go:903-910: the popped containers leave the annotation; once it holds no
	// device, bind-phase becomes success (plugin/util.go:370-396).
	remaining := encodePod(podDevices)
	annotations := map[string]string{devicesToAllocate: remaining}
	if strings.Trim(remaining, ";") == "" {
		annotations[bindPhaseAnnotation] = bindSuccess
	}
	if err := p.patchAnnotations(ctx, current, annotations); err != nil {
		p.failed(ctx, current)
		return &pluginapi.AllocateResponse{}, err
	}
	log.Printf("allocated %s/%s: %+v", current.Namespace, current.Name, responses.ContainerResponses)
	return responses, nil
}

// libPath is HAMi plugin/util.go:45-51 (GetLibPath) without a versioned library.
func (p *plugin) libPath() string {
	return p.opts.hookPath + "/vgpu/libvgpu.so"
}

// registerInAnnotation publishes the cards on the Node as HAMi's plugin does
// (plugin/register.go:271-298: hami.io/node-nvidia-register, the JSON of
// pkg/device/devices.go:127-140 DeviceInfo; its scheduler and this project's
// cluster view read it).
func (p *plugin) registerInAnnotation(ctx context.Context) error {
	type deviceInfo struct {
		ID      string `json:"id,omitempty"`
		Index   uint   `json:"index,omitempty"`
		Count   int32  `json:"count,omitempty"`
		Devmem  int32  `json:"devmem,omitempty"`
		Devcore int32  `json:"devcore,omitempty"`
		Type    string `json:"type,omitempty"`
		Numa    int    `json:"numa,omitempty"`
		Mode    string `json:"mode,omitempty"`
		Health  bool   `json:"health,omitempty"`
	}
	var cards []deviceInfo
	for i := 0; i < p.opts.gpus; i++ {
		cards = append(cards, deviceInfo{ID: UUIDOf(i), Index: uint(i), Count: int32(p.opts.replicas),
			Devmem: int32(p.opts.memory), Devcore: 100, Type: "NVIDIA-Fake GPU", Mode: "hami-core", Health: true})
	}
	encoded, err := json.Marshal(cards)
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		"hami.io/node-nvidia-register": string(encoded),
		"hami.io/node-handshake":       "Reported " + time.Now().Format("2006.01.02 15:04:05"),
	}}})
	if err != nil {
		return err
	}
	_, err = p.client.CoreV1().Nodes().Patch(ctx, p.opts.nodeName, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// failed is PodAllocationFailed (plugin/util.go:406-413): bind-phase failed.
func (p *plugin) failed(ctx context.Context, pod *corev1.Pod) {
	if err := p.patchAnnotations(ctx, pod, map[string]string{bindPhaseAnnotation: bindFailed}); err != nil {
		log.Printf("patch %s/%s: %v", pod.Namespace, pod.Name, err)
	}
}

func (p *plugin) register(socket string) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.opts.socketDir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(socket),
		ResourceName: p.opts.resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	return err
}

func main() {
	var o options
	flag.StringVar(&o.flavour, "flavour", "hami", "whose Allocate to answer with: hami or nvidia")
	flag.StringVar(&o.strategy, "strategy", "envvar", "device list strategy: envvar or volume-mounts")
	flag.StringVar(&o.resource, "resource", "nvidia.com/gpu", "extended resource to serve")
	flag.IntVar(&o.gpus, "gpus", 4, "fake cards (the node's CDI spec names them)")
	flag.IntVar(&o.replicas, "replicas", 10, "replicas advertised per card (HAMi's deviceSplitCount)")
	flag.StringVar(&o.socketDir, "socket-dir", pluginapi.DevicePluginPath, "the kubelet's device plugin directory")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig (HAMi reads its pending pod from the apiserver)")
	flag.StringVar(&o.nodeName, "node-name", "", "this node's name")
	flag.StringVar(&o.hookPath, "hook-path", "/usr/local", "HAMi's HOOK_PATH (chart global.gpuHookPath)")
	flag.Int64Var(&o.memory, "memory", 16384, "MiB per card")
	flag.StringVar(&o.mpsPipe, "mps-root", "", "nvidia flavour: the MPS daemon's host root (MPS on when set)")
	flag.Parse()
	if o.flavour != "hami" && o.flavour != "nvidia" || o.strategy != "envvar" && o.strategy != "volume-mounts" {
		log.Fatalf("-flavour hami|nvidia, -strategy envvar|volume-mounts")
	}
	p := &plugin{opts: o}
	if o.flavour == "hami" {
		config, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
		if err != nil {
			log.Fatal(err)
		}
		p.client = kubernetes.NewForConfigOrDie(config)
	}
	socket := filepath.Join(o.socketDir, "gpushare-"+o.flavour+".sock")
	kubeletSocket := filepath.Join(o.socketDir, "kubelet.sock")
	// The kubelet empties its device plugin directory when it starts, and forgets its
	// plugins when it restarts: serve and register again whenever our socket is gone
	// (as the upstream plugins do, watching the directory).
	var server *grpc.Server
	serve := func() error {
		if server != nil {
			server.Stop()
		}
		os.Remove(socket)
		listener, err := net.Listen("unix", socket)
		if err != nil {
			return err
		}
		server = grpc.NewServer()
		pluginapi.RegisterDevicePluginServer(server, p)
		go server.Serve(listener)
		return p.register(socket)
	}
	var err error
	for attempt := 0; ; attempt++ {
		if _, statErr := os.Stat(kubeletSocket); statErr == nil {
			if err = serve(); err == nil {
				break
			}
		}
		if attempt > 600 {
			log.Fatalf("register with the kubelet: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	go func() {
		for range time.Tick(time.Second) {
			if _, statErr := os.Stat(socket); statErr != nil {
				if _, kubeletErr := os.Stat(kubeletSocket); kubeletErr == nil {
					if err := serve(); err != nil {
						log.Printf("register again: %v", err)
					} else {
						log.Printf("registered again")
					}
				}
			}
		}
	}()
	if o.flavour == "hami" {
		// The Node may not be registered yet: try until it is.
		for attempt := 0; ; attempt++ {
			if err = p.registerInAnnotation(context.Background()); err == nil {
				break
			}
			if attempt > 300 {
				log.Fatalf("register the cards on the node: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	log.Printf("registered %s (%s, %s)", o.resource, o.flavour, o.strategy)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	server.Stop()
	os.Remove(socket)
}
