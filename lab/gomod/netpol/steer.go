package main

// Steering: which packets reach the controller's nfqueue. Upstream does it with an
// nftables `queue` rule, which needs the kernel's nft_queue (CONFIG_NFT_QUEUE); kernels
// without it (this lab's machine kind) refuse the whole batch, and no packet would ever be
// judged. The same rules in iptables use xt_NFQUEUE instead, through iptables-restore:
// mangle POSTROUTING (before SNAT, as upstream's chain at srcnat-5) jumps to chainName,
// which skips root's own traffic (the kubelet's probes, host daemons: upstream's `meta
// skuid 0 accept`) and established flows, and queues the first packet of every connection
// to or from a pod of this node that a NetworkPolicy selects (upstream's podips set).
// IPv4 only (the lab has no IPv6 pod addresses).

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

const chainName = "GPUK8S-NETPOL"

// steerer keeps chainName equal to the policy-selected pods of one node.
type steerer struct {
	factory  informers.SharedInformerFactory
	nodeName string
	queueID  int
	failOpen bool
	stale    chan struct{} // a pod or policy changed since the chain was written
}

// newSteerer registers its event handlers on factory's pod and NetworkPolicy informers
// (the controller's own: no second watch); call it before factory.Start.
func newSteerer(factory informers.SharedInformerFactory, nodeName string, queueID int, failOpen bool) (*steerer, error) {
	s := &steerer{factory: factory, nodeName: nodeName, queueID: queueID, failOpen: failOpen,
		stale: make(chan struct{}, 1)}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.mark() },
		UpdateFunc: func(any, any) { s.mark() },
		DeleteFunc: func(any) { s.mark() },
	}
	for _, informer := range []cache.SharedIndexInformer{
		factory.Networking().V1().NetworkPolicies().Informer(),
		factory.Core().V1().Pods().Informer(),
	} {
		if _, err := informer.AddEventHandler(handler); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *steerer) mark() {
	select {
	case s.stale <- struct{}{}:
	default:
	}
}

// selectedIPs: the IPv4 addresses of this node's pods that any NetworkPolicy selects.
func (s *steerer) selectedIPs() ([]string, error) {
	policies, err := s.factory.Networking().V1().NetworkPolicies().Lister().List(labels.Everything())
	if err != nil {
		return nil, err
	}
	pods := s.factory.Core().V1().Pods().Lister()
	seen := map[string]bool{}
	for _, np := range policies {
		selector, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			klog.InfoS("skipping a NetworkPolicy whose podSelector does not parse", "policy", np.Namespace+"/"+np.Name, "error", err)
			continue
		}
		selected, err := pods.Pods(np.Namespace).List(selector)
		if err != nil {
			return nil, err
		}
		for _, pod := range selected {
			if pod.Spec.NodeName != s.nodeName || pod.Spec.HostNetwork {
				continue
			}
			for _, ip := range pod.Status.PodIPs {
				if parsed := net.ParseIP(ip.IP); parsed != nil && parsed.To4() != nil {
					seen[ip.IP] = true
				}
			}
		}
	}
	ips := make([]string, 0, len(seen))
	for ip := range seen {
		ips = append(ips, ip)
	}
	sort.Strings(ips)
	return ips, nil
}

// rules: the iptables-restore input that makes chainName queue ips (the chain's
// declaration line empties it first, in the same atomic commit).
func (s *steerer) rules(ips []string) string {
	queue := fmt.Sprintf("-j NFQUEUE --queue-num %d", s.queueID)
	if s.failOpen {
		queue += " --queue-bypass"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*mangle\n:%s - [0:0]\n", chainName)
	fmt.Fprintf(&b, "-A %s -m owner --uid-owner 0 -j RETURN\n", chainName)
	fmt.Fprintf(&b, "-A %s -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN\n", chainName)
	for _, ip := range ips {
		fmt.Fprintf(&b, "-A %s -d %s/32 %s\n", chainName, ip, queue)
		fmt.Fprintf(&b, "-A %s -s %s/32 %s\n", chainName, ip, queue)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

func iptables(stdin string, args ...string) error {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// apply writes the chain, then makes sure POSTROUTING jumps to it.
func (s *steerer) apply(ips []string) error {
	if err := iptables(s.rules(ips), "iptables-restore", "--noflush", "--wait"); err != nil {
		return err
	}
	if iptables("", "iptables", "--wait", "-t", "mangle", "-C", "POSTROUTING", "-j", chainName) != nil {
		return iptables("", "iptables", "--wait", "-t", "mangle", "-I", "POSTROUTING", "1", "-j", chainName)
	}
	return nil
}

// run keeps the chain current until ctx ends (every pod or policy event marks it stale;
// a stale chain is rewritten at most every 200 ms), then removes it.
func (s *steerer) run(ctx context.Context) {
	defer removeChain()
	if !cache.WaitForCacheSync(ctx.Done(),
		s.factory.Networking().V1().NetworkPolicies().Informer().HasSynced,
		s.factory.Core().V1().Pods().Informer().HasSynced) {
		return
	}
	last := "-" // no address list: the first pass always writes the chain
	for {
		ips, err := s.selectedIPs()
		if err == nil && strings.Join(ips, ",") != last {
			if err = s.apply(ips); err == nil {
				last = strings.Join(ips, ",")
				klog.InfoS("steering to the nfqueue", "chain", chainName, "pods", ips)
			}
		}
		if err != nil {
			klog.ErrorS(err, "steering rules not applied; retrying")
			s.mark()
		}
		select {
		case <-ctx.Done():
			return
		case <-s.stale:
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// removeChain undoes apply (what is absent is no error).
func removeChain() {
	for iptables("", "iptables", "--wait", "-t", "mangle", "-D", "POSTROUTING", "-j", chainName) == nil {
	}
	_ = iptables("", "iptables", "--wait", "-t", "mangle", "-F", chainName)
	_ = iptables("", "iptables", "--wait", "-t", "mangle", "-X", chainName)
}
