# The sandbox util-linux builds where bubblewrap is missing (pdevidence/core/sandbox.py).
#
# Run by `unshare --user --map-root-user --mount --net --pid --fork --kill-child --ipc --uts` as root
# of that fresh user namespace: on a tmpfs mounted at MOUNTPOINT (an empty directory the harness
# made) it builds a root holding only what it is told, as bubblewrap would (read-only binds made
# read-only all the way down, writable binds, tmpfs, masks: tmpfs made read-only once what goes
# inside them is there, symlinks), a minimal /dev, a new /proc with
# its system knobs read-only and /sys read-only; pivots into it; checks that nothing else is
# writable; drops every capability and runs the command in CWD.
#
#   sh unshare_sandbox.sh MOUNTPOINT SCRATCH_BYTES MASK_BYTES CWD {ro|rw|tmpfs|mask|symlink} TARGET PATH ... \
#       -- COMMAND...
set -eu
command_path=$PATH
PATH=/usr/sbin:/usr/bin:/sbin:/bin
setpriv=$(command -v setpriv)
root=$1 size=$2 mask_size=$3 cwd=$4
shift 4
writable="/proc /dev/shm"
masks=""

# Every mount at or under $1 read-only, keeping the flags the kernel locks in a user namespace.
readonly_below() {
    awk -v top="$1" '
        { p = $5; gsub(/\\040/, " ", p) }
        p == top || index(p, top "/") == 1 {
            n = split($6, f, ","); o = "remount,bind,ro"
            for (i = 1; i <= n; i++) if (f[i] ~ /^(nosuid|nodev|noexec|noatime|nodiratime|relatime|strictatime)$/) o = o "," f[i]
            print o "\t" p
        }' /proc/self/mountinfo | while IFS="	" read -r opts point; do mount -o "$opts" "$point" || exit 1; done
}

mount --make-rprivate /
host_mounts=$(cat /proc/self/mountinfo)  # where a bind must be recursive, and its mounts made read-only
mount -t tmpfs -o mode=0755,size=16m pdevidence-root "$root"

while [ "$1" != -- ]; do
    op=$1 target=$2 path=$3
    shift 3
    dest=$root$path
    case $op in
        symlink)
            mkdir -p "$(dirname "$dest")"
            ln -s "$target" "$dest" ;;
        tmpfs)
            mkdir -p "$dest"
            mount -t tmpfs -o "size=$size,mode=1777,nosuid,nodev" pdevidence-scratch "$dest"
            writable="$writable $path" ;;
        mask)
            mkdir -p "$dest"
            mount -t tmpfs -o "size=$mask_size,mode=0755,nosuid,nodev" pdevidence-mask "$dest"
            masks="$masks $dest" ;;
        ro|rw)
            if [ -d "$path" ]; then
                mkdir -p "$dest"
            else
                [ -d "${dest%/*}" ] || mkdir -p "${dest%/*}"
                : > "$dest"
            fi
            case $op:$host_mounts in
                ro:*" $path/"*)
                    mount --rbind "$path" "$dest"
                    readonly_below "$dest" ;;
                ro:*)  # nothing is mounted below it (most entries a mask shows): read-only as it is bound
                    mount --bind -o ro "$path" "$dest" ;;
                *)
                    mount --rbind "$path" "$dest"
                    writable="$writable $path" ;;
            esac ;;
        *)
            echo "unshare_sandbox.sh: unknown operation $op" >&2
            exit 1 ;;
    esac
done
shift
for dest in $masks; do mount -o remount,bind,ro,nosuid,nodev "$dest"; done

mkdir -p "$root/dev" "$root/proc" "$root/sys"
mount -t tmpfs -o mode=0755,size=1m,nosuid,noexec pdevidence-dev "$root/dev"
for node in null zero full random urandom tty; do
    : > "$root/dev/$node"
    mount --bind "/dev/$node" "$root/dev/$node"
    writable="$writable /dev/$node"
done
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
mkdir "$root/dev/shm"
mount -t tmpfs -o "size=$size,mode=1777,nosuid,nodev" pdevidence-shm "$root/dev/shm"
mount -o remount,bind,ro,nosuid,noexec "$root/dev"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
for knob in sys sysrq-trigger irq bus; do
    if [ -e "$root/proc/$knob" ]; then
        mount --bind "$root/proc/$knob" "$root/proc/$knob"
        mount -o remount,bind,ro "$root/proc/$knob"
    fi
done
if [ -d /sys ]; then
    mount --rbind /sys "$root/sys"
    readonly_below "$root/sys"
fi

mkdir "$root/.old"
cd "$root"
pivot_root . .old
cd /
umount -l /.old
rmdir /.old
mount -o remount,bind,ro /

# Fail closed: a mount left writable that was not asked for (a path the loops above could not match).
awk -v allowed="$writable" '
    BEGIN { n = split(allowed, a, " "); for (i = 1; i <= n; i++) ok[a[i]] = 1 }
    $6 !~ /^ro(,|$)/ { p = $5; gsub(/\\040/, " ", p); if (!(p in ok)) { print p; bad = 1 } }
    END { exit bad }' /proc/self/mountinfo >&2 || { echo "unshare_sandbox.sh: mounts above left writable" >&2; exit 1; }

cd "$cwd"
PATH=$command_path
exec "$setpriv" --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- "$@"
