"""Reading the CDK CLI's diff lines: the resource, its logical id, its path and the impact."""

from __future__ import annotations

from preview.cdk_diff import parse

# As `cdk diff` prints them (aws-cdk 2.x): an ingress rule's construct path holds a space.
CLI_OUTPUT = """Resources
[~] AWS::EC2::SecurityGroupIngress pddevpdservingEfaFabricSecurityGroup99CFA6E5:ALL TRAFFIC EfaFabricSecurityGroupfrompddevpdservingEfaFabricSecurityGroup99CFA6E5ALLTRAFFICD5250F60 replace
 ├─ [~] GroupId (requires replacement)
 └─ [~] SourceSecurityGroupId (requires replacement)
[~] AWS::EKS::Nodegroup Eks/Cluster/NodegroupDecodeNodes EksClusterNodegroupDecodeNodes6526137E may be replaced
 └─ [~] Subnets (may cause replacement)
[+] AWS::EKS::AccessEntry Eks/Cluster/Admin0 EksClusterAdmin0AB12CD34
[-] AWS::EKS::AccessEntry EksClusterAdmin1E23D5C9A destroy
[~] Custom::AWSCDK-EKS-KubernetesResource Serving/manifest-RayService/Resource ServingmanifestRayService2B8A9F1C
 └─ [~] Manifest

Outputs
[~] Output ClusterName ClusterName
"""


def test_each_resource_line_gives_its_logical_id_path_and_impact():
    changes = parse(CLI_OUTPUT)
    assert [(c.op, c.logical_id, c.impact) for c in changes] == [
        ("~", "EfaFabricSecurityGroupfrompddevpdservingEfaFabricSecurityGroup99CFA6E5ALLTRAFFICD5250F60", "replace"),
        ("~", "EksClusterNodegroupDecodeNodes6526137E", "may be replaced"),
        ("+", "EksClusterAdmin0AB12CD34", ""),
        ("-", "EksClusterAdmin1E23D5C9A", "destroy"),
        ("~", "ServingmanifestRayService2B8A9F1C", ""),
    ]
    assert changes[0].path == "pddevpdservingEfaFabricSecurityGroup99CFA6E5:ALL TRAFFIC"
    assert changes[0].properties == {"GroupId": "requires replacement", "SourceSecurityGroupId": "requires replacement"}
    assert changes[1].replaced is False and changes[1].may_be_replaced is True
    assert changes[3].path == "" and changes[4].path.endswith("manifest-RayService/Resource")
