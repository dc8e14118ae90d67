# Patch performance-tests/pom.xml so it builds offline-from-Central:
#  - drop winsw dependency (com.sun.winsw:winsw is not on Maven Central)
#  - drop build plugins that need non-Central downloads or produce deb/rpm/windows pkgs:
#    maven-dependency-plugin (copies winsw), gradle-maven-plugin (downloads Gradle),
#    maven-assembly-plugin (windows zip), maven-install-plugin (install-deb at package phase)
import re, sys
p = sys.argv[1]
s = open(p).read()
s, n = re.subn(r'\s*<dependency>\s*<groupId>com\.sun\.winsw</groupId>.*?</dependency>', '', s, flags=re.S)
assert n == 1, n
start = s.index('</pluginManagement>')
end = s.index('</plugins>', start)
sec = s[start:end]
for art in ['maven-dependency-plugin', 'gradle-maven-plugin', 'maven-assembly-plugin', 'maven-install-plugin']:
    sec, n = re.subn(r'\s*<plugin>\s*<groupId>[^<]+</groupId>\s*<artifactId>%s</artifactId>\s*</plugin>' % art, '', sec)
    assert n == 1, (art, n)
s = s[:start] + sec + s[end:]
# maven-install-plugin is a default-lifecycle plugin, so its pluginManagement execution
# (install-deb, bound to package) still runs: drop that whole pluginManagement block.
s, n = re.subn(r'\s*<plugin>\s*<groupId>org\.apache\.maven\.plugins</groupId>\s*<artifactId>maven-install-plugin</artifactId>.*?</plugin>', '', s, count=1, flags=re.S)
assert n == 1, ('install', n)
open(p, 'w').write(s)
print("patched", p)
