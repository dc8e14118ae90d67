#!/usr/bin/env bash
# Builds ThingsBoard's performance-test tool (thingsboard/performance-tests, which pins
# thingsboard.version 4.0.1) against ThingsBoard 4.0.1 modules built from source, using
# Maven Central only (the ThingsBoard repository is not needed).
# Needs: git, JDK 17, Maven, network access to repo1.maven.org.
# Result: $PERFTOOL_DIR/performance-tests/target/tb-ce-performance-tests-4.0.1-boot.jar
# (bench/tb_perf_gateway.sh takes it as PERF_JAR).
# Env:
#   PERFTOOL_DIR  work directory (default: <repo>/target/perftool); removed sources are re-extracted
#   TB_GIT        git dir or URL of thingsboard/thingsboard   (default: the GitHub URL)
#   TB_REF        its ref                                      (default: v4.0.1)
#   PT_GIT        git dir or URL of thingsboard/performance-tests (default: the GitHub URL)
#   PT_REF        its ref (default: 8d36cfe9aaf646ccead0d22db1d378678387c412, the commit tested)
#   M2_REPO       Maven local repository (default: $PERFTOOL_DIR/m2)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mkdir -p "${PERFTOOL_DIR:-$HERE/../../target/perftool}" && cd "${PERFTOOL_DIR:-$HERE/../../target/perftool}" && pwd)
TB_GIT=${TB_GIT:-https://github.com/thingsboard/thingsboard.git}; TB_REF=${TB_REF:-v4.0.1}
PT_GIT=${PT_GIT:-https://github.com/thingsboard/performance-tests.git}
PT_REF=${PT_REF:-8d36cfe9aaf646ccead0d22db1d378678387c412}
MVN="mvn -B -s $W/settings.xml -T 1 -DskipTests -Dlicense.skip=true -Dmaven.javadoc.skip=true -Dgpg.skip"
M2_REPO=${M2_REPO:-$W/m2}; mkdir -p "$M2_REPO"
cat > "$W/settings.xml" <<XML
<settings><localRepository>$M2_REPO</localRepository>
<mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf><url>https://repo1.maven.org/maven2/</url></mirror></mirrors></settings>
XML
# export REF of a git dir (bare or not) or of a remote URL into DEST
export_tree() { # SRC REF DEST
  local src=$1 ref=$2 dest=$3 gd
  rm -rf "$dest"; mkdir -p "$dest"
  if [ -d "$src" ]; then gd=$src
  else
    gd=$W/$(basename "$dest").git
    [ -d "$gd" ] || git init -q --bare "$gd"
    git --git-dir="$gd" fetch -q --depth 1 "$src" "$ref" 2>/dev/null \
      || git --git-dir="$gd" fetch -q "$src" "+refs/tags/*:refs/tags/*" "+refs/heads/*:refs/heads/*"
    git --git-dir="$gd" rev-parse -q --verify "$ref^{commit}" >/dev/null || ref=FETCH_HEAD
  fi
  git --git-dir="$gd" archive "$ref" | tar -x -C "$dest"
}
export_tree "$TB_GIT" "$TB_REF" "$W/thingsboard"        # tag matching perf-tests' thingsboard.version
export_tree "$PT_GIT" "$PT_REF" "$W/performance-tests"
(cd "$W/thingsboard" && $MVN -pl netty-mqtt,common/data,common/util,rest-client -am install)
cp "$W/performance-tests/pom.xml" "$W/performance-tests/pom.xml.orig"
python3 "$HERE/patch_perf_pom.py" "$W/performance-tests/pom.xml"
# logback 1.5.18 (perf-tests pom) is binary-incompatible with spring-boot 3.2.12 -> use TB 4.0.1's 1.5.5
(cd "$W/performance-tests" && $MVN -Dlogback.version=1.5.5 package)
ls -l "$W/performance-tests/target/tb-ce-performance-tests-4.0.1-boot.jar"
