// Reading PSI and cgroup files.
#include <gtest/gtest.h>

#include "host/pressure.h"

using namespace gpuscope;

TEST(Pressure, TotalsOfSomeAndFull) {
  const auto [some, full] = host::parse_pressure(
      "some avg10=1.50 avg60=0.20 avg300=0.05 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=789\n");
  EXPECT_EQ(some, 123456u);
  EXPECT_EQ(full, 789u);
  // /proc/pressure/cpu before 5.13 has no `full` line.
  const auto [cpu, none] = host::parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n");
  EXPECT_EQ(cpu, 42u);
  EXPECT_FALSE(none);
  EXPECT_FALSE(host::parse_pressure("garbage").first);
}

TEST(Pressure, TheCgroupOfAProcess) {
  const std::string hybrid = "12:memory:/job\n4:cpu,cpuacct:/job/cpu\n0::/user.slice/session-1.scope\n";
  // v2 at /sys/fs/cgroup: its line; v2 beside v1 (at /sys/fs/cgroup/unified): v1's cpu controller.
  EXPECT_EQ(host::parse_cgroup(hybrid, true), (std::pair<std::string, bool>{"/user.slice/session-1.scope", true}));
  EXPECT_EQ(host::parse_cgroup(hybrid, false), (std::pair<std::string, bool>{"/job/cpu", false}));
  EXPECT_EQ(host::parse_cgroup("0::/kubepods/pod1/c1\n", true), (std::pair<std::string, bool>{"/kubepods/pod1/c1", true}));
  EXPECT_FALSE(host::parse_cgroup("0::/x\n", false));
}

TEST(Pressure, TcpSegmentsSentAndRetransmitted) {
  const std::string snmp =
      "Ip: Forwarding DefaultTTL\nIp: 1 64\n"
      "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs "
      "OutSegs RetransSegs InErrs OutRsts InCsumErrors\n"
      "Tcp: 1 200 120000 -1 705507 705087 369 656956 0 5061412 5059876 3 0 679048 0\n"
      "Udp: InDatagrams NoPorts\nUdp: 1 2\n";
  EXPECT_EQ(host::parse_tcp_segments(snmp), (std::pair<uint64_t, uint64_t>{5059876, 3}));
  EXPECT_FALSE(host::parse_tcp_segments("Tcp: OutSegs\n"));
  EXPECT_FALSE(host::parse_tcp_segments("Tcp: OutSegs RetransSegs\nTcp: x 1\n"));
  EXPECT_FALSE(host::parse_tcp_segments(""));
}
